/* PolyBench 2mm: Dout := alpha * A * B * C + beta * D, in PolyBench's loop order. */
static double tmp[NI][NJ];

void kernel(double alpha, double beta, const double A[restrict NI][NK], const double B[restrict NK][NJ],
            const double C[restrict NJ][NL], const double D[restrict NI][NL], double Dout[restrict NI][NL])
{
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NJ; j++) {
            tmp[i][j] = 0.0;
            for (int k = 0; k < NK; ++k)
                tmp[i][j] += alpha * A[i][k] * B[k][j];
        }
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NL; j++) {
            Dout[i][j] = D[i][j] * beta;
            for (int k = 0; k < NJ; ++k)
                Dout[i][j] += tmp[i][k] * C[k][j];
        }
}
