/* depthwise layer, channels last: O(n, h, w, c) = max(B(c) + sum_{kh, kw} I(n, h + kh - P, w + kw - P, c)
   * W1(kh, kw, c), 0), the taps outside the image skipped (zero padding P = K / 2). */
#include <math.h>
#define P (K / 2)
void kernel(const float I[restrict N][H][W][C], const float W1[restrict K][K][C], const float B[restrict C],
            float O[restrict N][H][W][C])
{
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++) {
                for (int c = 0; c < C; c++)
                    O[n][h][w][c] = 0.0f;
                for (int kh = 0; kh < K; kh++)
                    for (int kw = 0; kw < K; kw++) {
                        const int y = h + kh - P, x = w + kw - P;
                        if (y < 0 || y >= H || x < 0 || x >= W)
                            continue;
                        for (int c = 0; c < C; c++)
                            O[n][h][w][c] += I[n][y][x][c] * W1[kh][kw][c];
                    }
                for (int c = 0; c < C; c++)
                    O[n][h][w][c] = fmaxf(O[n][h][w][c] + B[c], 0.0f);
            }
}
