/* PolyBench gesummv: y := alpha * A * x + beta * B * x, in PolyBench's loop order. */
static double tmp[N];

void kernel(double alpha, double beta, const double A[restrict N][N], const double B[restrict N][N],
            const double x[restrict N], double y[restrict N])
{
    for (int i = 0; i < N; i++) {
        tmp[i] = 0.0;
        y[i] = 0.0;
        for (int j = 0; j < N; j++) {
            tmp[i] = A[i][j] * x[j] + tmp[i];
            y[i] = B[i][j] * x[j] + y[i];
        }
        y[i] = alpha * tmp[i] + beta * y[i];
    }
}
