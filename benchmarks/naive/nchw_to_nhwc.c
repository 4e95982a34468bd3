/* nchw_to_nhwc: O(n, h, w, c) = X(n, c, h, w), the loops in the output's order. */
void kernel(const float X[restrict N][C][H][W], float O[restrict N][H][W][C])
{
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++)
                for (int c = 0; c < C; c++)
                    O[n][h][w][c] = X[n][c][h][w];
}
