/* PolyBench 3mm: G := (A * B) * (C * D), in PolyBench's loop order. */
static double E[NI][NJ];
static double F[NJ][NL];

void kernel(const double A[restrict NI][NK], const double B[restrict NK][NJ], const double C[restrict NJ][NM],
            const double D[restrict NM][NL], double G[restrict NI][NL])
{
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NJ; j++) {
            E[i][j] = 0.0;
            for (int k = 0; k < NK; ++k)
                E[i][j] += A[i][k] * B[k][j];
        }
    for (int i = 0; i < NJ; i++)
        for (int j = 0; j < NL; j++) {
            F[i][j] = 0.0;
            for (int k = 0; k < NM; ++k)
                F[i][j] += C[i][k] * D[k][j];
        }
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NL; j++) {
            G[i][j] = 0.0;
            for (int k = 0; k < NJ; ++k)
                G[i][j] += E[i][k] * F[k][j];
        }
}
