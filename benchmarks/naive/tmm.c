/* tmm: C(m, n) = sum_k A(m, k) * B(n, k), i.e. C = A * B^T.  The reduction is innermost:
   both operands are read along k with unit stride. */
void kernel(const float A[restrict M][K], const float B[restrict N][K], float C[restrict M][N])
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            C[m][n] = 0.0f;
            for (int k = 0; k < K; k++)
                C[m][n] += A[m][k] * B[n][k];
        }
}
