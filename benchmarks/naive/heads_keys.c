/* heads_keys: O(b, h, d, s) = X(b, s, h, d) (attention's K^T), the loops in the output's order. */
void kernel(const float X[restrict B][S][H][D], float O[restrict B][H][D][S])
{
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++)
                for (int s = 0; s < S; s++)
                    O[b][h][d][s] = X[b][s][h][d];
}
