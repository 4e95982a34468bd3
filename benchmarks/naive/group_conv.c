/* group_conv: O(n, g, f, h, w) = B(g, f) + sum_{c, kh, kw} I(n, g, c, h + kh, w + kw) * W1(g, f, c, kh, kw)
   (valid convolution, stride 1). */
#define OH (H - KH + 1)
#define OW (W - KW + 1)
void kernel(const float I[restrict N][G][C][H][W], const float W1[restrict G][F][C][KH][KW],
            const float B[restrict G][F], float O[restrict N][G][F][OH][OW])
{
    for (int n = 0; n < N; n++)
        for (int g = 0; g < G; g++)
            for (int f = 0; f < F; f++)
                for (int h = 0; h < OH; h++) {
                    for (int w = 0; w < OW; w++)
                        O[n][g][f][h][w] = B[g][f];
                    for (int c = 0; c < C; c++)
                        for (int kh = 0; kh < KH; kh++)
                            for (int kw = 0; kw < KW; kw++)
                                for (int w = 0; w < OW; w++)
                                    O[n][g][f][h][w] += I[n][g][c][h + kh][w + kw] * W1[g][f][c][kh][kw];
                }
}
