/* PolyBench bicg: s := A^T * r, q := A * p, in PolyBench's loop order. */
void kernel(const double A[restrict N][M], const double p[restrict M], const double r[restrict N],
            double s[restrict M], double q[restrict N])
{
    for (int i = 0; i < M; i++)
        s[i] = 0.0;
    for (int i = 0; i < N; i++) {
        q[i] = 0.0;
        for (int j = 0; j < M; j++) {
            s[j] = s[j] + r[i] * A[i][j];
            q[i] = q[i] + A[i][j] * p[j];
        }
    }
}
