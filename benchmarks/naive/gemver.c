/* PolyBench gemver (x and w start at zero, as PolyBench initialises them), in PolyBench's loop order:
   A2 := A + u1 v1^T + u2 v2^T;  x := beta * A2^T y + z;  w := alpha * A2 x. */
void kernel(double alpha, double beta, const double A[restrict N][N], const double u1[restrict N],
            const double v1[restrict N], const double u2[restrict N], const double v2[restrict N],
            const double y[restrict N], const double z[restrict N],
            double A2[restrict N][N], double x[restrict N], double w[restrict N])
{
    for (int i = 0; i < N; i++) {
        x[i] = 0.0;
        w[i] = 0.0;
    }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            A2[i][j] = A[i][j] + u1[i] * v1[j] + u2[i] * v2[j];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            x[i] = x[i] + beta * A2[j][i] * y[j];
    for (int i = 0; i < N; i++)
        x[i] = x[i] + z[i];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            w[i] = w[i] + alpha * A2[i][j] * x[j];
}
