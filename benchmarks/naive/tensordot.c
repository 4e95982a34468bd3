/* tensordot: O(n, c1, c3, h, w) = sum_c2 I0(n, c1, c2, h, w) * I1(n, c2, c3, h, w). */
void kernel(const float I0[restrict N][C1][C2][H][W], const float I1[restrict N][C2][C3][H][W],
            float O[restrict N][C1][C3][H][W])
{
    for (int n = 0; n < N; n++)
        for (int c1 = 0; c1 < C1; c1++)
            for (int c3 = 0; c3 < C3; c3++) {
                for (int h = 0; h < H; h++)
                    for (int w = 0; w < W; w++)
                        O[n][c1][c3][h][w] = 0.0f;
                for (int c2 = 0; c2 < C2; c2++)
                    for (int h = 0; h < H; h++)
                        for (int w = 0; w < W; w++)
                            O[n][c1][c3][h][w] += I0[n][c1][c2][h][w] * I1[n][c2][c3][h][w];
            }
}
