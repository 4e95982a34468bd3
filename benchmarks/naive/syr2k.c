/* PolyBench syr2k: Cout := alpha * (A * B^T + B * A^T) + beta * C on the lower triangle (j <= i),
   C elsewhere; PolyBench's loop order. */
void kernel(double alpha, double beta, const double C[restrict N][N], const double A[restrict N][M],
            const double B[restrict N][M], double Cout[restrict N][N])
{
    for (int i = 0; i < N; i++) {
        for (int j = i + 1; j < N; j++)
            Cout[i][j] = C[i][j];
        for (int j = 0; j <= i; j++)
            Cout[i][j] = C[i][j] * beta;
        for (int k = 0; k < M; k++)
            for (int j = 0; j <= i; j++)
                Cout[i][j] += A[j][k] * alpha * B[i][k] + B[j][k] * alpha * A[i][k];
    }
}
