static void polyc_tr_tile(const T *s, T *d, int64_t rows, int64_t cols, int64_t sp, int64_t dp)
{
    int64_t j = 0;
#if defined(POLYC_TR_BLOCK)
    /* a block of output rows at a time, written along their length: each output line is
       finished before the next is started, whatever the rows' distance (rows a power of two
       apart share cache sets, and a line left half-written would be evicted before its end) */
    const int64_t B = POLYC_TR_BLOCK;
    for (; j + B <= cols; j += B) {
        int64_t i = 0;
        for (; i + B <= rows; i += B)
            polyc_tr_block((const polyc_tr_lane_t *)(s + i * sp + j), (polyc_tr_lane_t *)(d + j * dp + i), sp, dp);
        for (int64_t k = j; k < j + B; k++)
            for (int64_t l = i; l < rows; l++) d[k * dp + l] = s[l * sp + k];
    }
#endif
    /* the output rows left over (all of them in the portable build), along their length */
    for (; j < cols; j++)
        for (int64_t l = 0; l < rows; l++) d[j * dp + l] = s[l * sp + j];
}
