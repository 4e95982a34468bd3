/* layernorm over the rows of X(N, D): Y = (X - mean) / sqrt(var + 1e-5) * gamma + beta. */
#include <math.h>
void kernel(const float X[restrict N][D], const float gamma[restrict D], const float beta[restrict D],
            float Y[restrict N][D])
{
    for (int n = 0; n < N; n++) {
        float sum = 0.0f;
        for (int d = 0; d < D; d++)
            sum += X[n][d];
        float mean = sum / D;
        float var = 0.0f;
        for (int d = 0; d < D; d++)
            var += (X[n][d] - mean) * (X[n][d] - mean);
        float rstd = 1.0f / sqrtf(var / D + 1e-5f);
        for (int d = 0; d < D; d++)
            Y[n][d] = (X[n][d] - mean) * rstd * gamma[d] + beta[d];
    }
}
