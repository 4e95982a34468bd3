/* Kronecker3_1: XW2(m, n0, n1, d2) = sum_n2 X(m, n0, n1, n2) * W2(d2, n2).  The reduction is
   innermost: both operands are read along n2 with unit stride. */
void kernel(const float W2[restrict D2][N2], const float X[restrict M][N0][N1][N2],
            float XW2[restrict M][N0][N1][D2])
{
    for (int m = 0; m < M; m++)
        for (int n0 = 0; n0 < N0; n0++)
            for (int n1 = 0; n1 < N1; n1++)
                for (int d2 = 0; d2 < D2; d2++) {
                    XW2[m][n0][n1][d2] = 0.0f;
                    for (int n2 = 0; n2 < N2; n2++)
                        XW2[m][n0][n1][d2] += X[m][n0][n1][n2] * W2[d2][n2];
                }
}
