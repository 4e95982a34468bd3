/* Kronecker3_2: XW2W1(m, n0, d1, d2) = sum_n1 XW2(m, n0, n1, d2) * W1(d1, n1). */
void kernel(const float W1[restrict D1][N1], const float XW2[restrict M][N0][N1][D2],
            float XW2W1[restrict M][N0][D1][D2])
{
    for (int m = 0; m < M; m++)
        for (int n0 = 0; n0 < N0; n0++)
            for (int d1 = 0; d1 < D1; d1++) {
                for (int d2 = 0; d2 < D2; d2++)
                    XW2W1[m][n0][d1][d2] = 0.0f;
                for (int n1 = 0; n1 < N1; n1++)
                    for (int d2 = 0; d2 < D2; d2++)
                        XW2W1[m][n0][d1][d2] += XW2[m][n0][n1][d2] * W1[d1][n1];
            }
}
