/* PolyBench mvt: x1_out := x1 + A * y_1, x2_out := x2 + A^T * y_2, in PolyBench's loop order. */
void kernel(const double x1[restrict N], const double x2[restrict N], const double y_1[restrict N],
            const double y_2[restrict N], const double A[restrict N][N],
            double x1_out[restrict N], double x2_out[restrict N])
{
    for (int i = 0; i < N; i++) {
        x1_out[i] = x1[i];
        x2_out[i] = x2[i];
    }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            x1_out[i] = x1_out[i] + A[i][j] * y_1[j];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            x2_out[i] = x2_out[i] + A[j][i] * y_2[j];
}
