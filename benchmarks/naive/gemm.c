/* PolyBench gemm: Cout := alpha * A * B + beta * C, in PolyBench's loop order. */
void kernel(double alpha, double beta, const double C[restrict NI][NJ], const double A[restrict NI][NK],
            const double B[restrict NK][NJ], double Cout[restrict NI][NJ])
{
    for (int i = 0; i < NI; i++) {
        for (int j = 0; j < NJ; j++)
            Cout[i][j] = C[i][j] * beta;
        for (int k = 0; k < NK; k++)
            for (int j = 0; j < NJ; j++)
                Cout[i][j] += alpha * A[i][k] * B[k][j];
    }
}
