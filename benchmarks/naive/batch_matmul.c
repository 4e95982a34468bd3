/* batch_matmul: Z(b, n, k) = sum_m X(b, n, m) * Y(b, m, k). */
void kernel(const float X[restrict B][N][M], const float Y[restrict B][M][K], float Z[restrict B][N][K])
{
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            for (int k = 0; k < K; k++)
                Z[b][n][k] = 0.0f;
            for (int m = 0; m < M; m++)
                for (int k = 0; k < K; k++)
                    Z[b][n][k] += X[b][n][m] * Y[b][m][k];
        }
}
