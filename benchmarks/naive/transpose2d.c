/* transpose2d: O(n, m) = X(m, n), the loops in the output's order. */
void kernel(const float X[restrict M][N], float O[restrict N][M])
{
    for (int n = 0; n < N; n++)
        for (int m = 0; m < M; m++)
            O[n][m] = X[m][n];
}
