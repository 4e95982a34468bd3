/* Kronecker3_3: Y(m, d0, d1, d2) = sum_n0 XW2W1(m, n0, d1, d2) * W0(d0, n0). */
void kernel(const float W0[restrict D0][N0], const float XW2W1[restrict M][N0][D1][D2],
            float Y[restrict M][D0][D1][D2])
{
    for (int m = 0; m < M; m++)
        for (int d0 = 0; d0 < D0; d0++) {
            for (int d1 = 0; d1 < D1; d1++)
                for (int d2 = 0; d2 < D2; d2++)
                    Y[m][d0][d1][d2] = 0.0f;
            for (int n0 = 0; n0 < N0; n0++)
                for (int d1 = 0; d1 < D1; d1++)
                    for (int d2 = 0; d2 < D2; d2++)
                        Y[m][d0][d1][d2] += XW2W1[m][n0][d1][d2] * W0[d0][n0];
        }
}
