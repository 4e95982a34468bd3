
/* dst[k*height + i] = src[i*ld + k] (times scale when scaled) for i < rows, zero for
   rows <= i < height, k < kc: a sliver of A whose rows run along K. */
static inline void polyc_pack_rows_along_k(const T *restrict src, int64_t ld, int rows, int height,
                                           int64_t kc, int scaled, T scale, T *restrict dst)
{
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < height; i++)
            dst[k * height + i] = i >= rows ? 0 : scaled ? scale * src[i * ld + k] : src[i * ld + k];
}
