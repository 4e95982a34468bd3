/* mlp1: O1(b, n) = max(sum_m I(b, m) * W1(m, n) + B1(n), 0). */
#include <math.h>
void kernel(const float I[restrict B][M], const float W1[restrict M][N], const float B1[restrict N],
            float O1[restrict B][N])
{
    for (int b = 0; b < B; b++) {
        for (int n = 0; n < N; n++)
            O1[b][n] = 0.0f;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                O1[b][n] += I[b][m] * W1[m][n];
        for (int n = 0; n < N; n++)
            O1[b][n] = fmaxf(O1[b][n] + B1[n], 0.0f);
    }
}
