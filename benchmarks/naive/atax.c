/* PolyBench atax: y := A^T * (A * x), in PolyBench's loop order. */
static double tmp[M];

void kernel(const double A[restrict M][N], const double x[restrict N], double y[restrict N])
{
    for (int i = 0; i < N; i++)
        y[i] = 0.0;
    for (int i = 0; i < M; i++) {
        tmp[i] = 0.0;
        for (int j = 0; j < N; j++)
            tmp[i] = tmp[i] + A[i][j] * x[j];
        for (int j = 0; j < N; j++)
            y[j] = y[j] + A[i][j] * tmp[i];
    }
}
