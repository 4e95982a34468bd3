/* conv3x3 layer: O(n, f, h, w) = max(B(f) + sum_{c, kh, kw} I(n, c, h + kh, w + kw) * W1(f, c, kh, kw), 0)
   (valid convolution, stride 1). */
#include <math.h>
#define OH (H - KH + 1)
#define OW (W - KW + 1)
void kernel(const float I[restrict N][C][H][W], const float W1[restrict F][C][KH][KW],
            const float B[restrict F], float O[restrict N][F][OH][OW])
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++)
            for (int h = 0; h < OH; h++) {
                for (int w = 0; w < OW; w++)
                    O[n][f][h][w] = 0.0f;
                for (int c = 0; c < C; c++)
                    for (int kh = 0; kh < KH; kh++)
                        for (int kw = 0; kw < KW; kw++)
                            for (int w = 0; w < OW; w++)
                                O[n][f][h][w] += I[n][c][h + kh][w + kw] * W1[f][c][kh][kw];
                for (int w = 0; w < OW; w++)
                    O[n][f][h][w] = fmaxf(O[n][f][h][w] + B[f], 0.0f);
            }
}
