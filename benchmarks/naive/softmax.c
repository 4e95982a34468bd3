/* softmax over the rows of X(N, D): O(n, d) = exp(X(n, d) - max_d X(n, d)) / sum_d exp(...). */
#include <math.h>
void kernel(const float X[restrict N][D], float O[restrict N][D])
{
    for (int n = 0; n < N; n++) {
        float row_max = -INFINITY;
        for (int d = 0; d < D; d++)
            row_max = fmaxf(row_max, X[n][d]);
        float sum = 0.0f;
        for (int d = 0; d < D; d++) {
            O[n][d] = expf(X[n][d] - row_max);
            sum += O[n][d];
        }
        for (int d = 0; d < D; d++)
            O[n][d] = O[n][d] / sum;
    }
}
