/* nhwc_to_nchw: O(n, c, h, w) = X(n, h, w, c), the loops in the output's order. */
void kernel(const float X[restrict N][H][W][C], float O[restrict N][C][H][W])
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++)
                    O[n][c][h][w] = X[n][h][w][c];
}
