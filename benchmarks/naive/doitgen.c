/* PolyBench doitgen: Aout(r, q, p) := sum_s A(r, q, s) * C4(s, p), in PolyBench's loop order
   (PolyBench updates A in place; here the result goes to Aout). */
static double sum[NP];

void kernel(const double A[restrict NR][NQ][NP], const double C4[restrict NP][NP],
            double Aout[restrict NR][NQ][NP])
{
    for (int r = 0; r < NR; r++)
        for (int q = 0; q < NQ; q++) {
            for (int p = 0; p < NP; p++) {
                sum[p] = 0.0;
                for (int s = 0; s < NP; s++)
                    sum[p] += A[r][q][s] * C4[s][p];
            }
            for (int p = 0; p < NP; p++)
                Aout[r][q][p] = sum[p];
        }
}
