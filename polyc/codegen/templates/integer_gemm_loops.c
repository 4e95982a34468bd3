
/* ---- the integer product's packing, cache blocks and threads (polyc/codegen/integer_gemm.py) ----
   Defined before this text, per instruction set: MR x NR (the register block), G (values of K
   per group: 4 for dot products of bytes, 2 for pairs of int16, 1), polyc_pa and polyc_pb (the
   packed element types), POLYC_A_SHIFT and POLYC_B_SHIFT (added to every value as it is
   packed, so that it fits the instruction's operand type), MC and KC (cache blocks) and
   polyc_ikernel (the micro-kernel). */

/* A packed sliver: a tail of int32 corrections, then the values, [kg][MR][G] for A and
   [kg][NR][G] for B (kg = K block / G rounded up, zeros past the edges).
   A's tail: za[i], the row's zero point (plus the shift), and t[i] = rowsum[i] - kc * za[i].
   B's tail: zb[j], the column's zero point (plus the shift), and cs[j] = colsum[j].
   With packed values a' and b' (shifted) and zero points za', zb' (shifted alike),
   sum (a - za)(b - zb) = sum (a' - za')(b' - zb') = sum a'b' - zb' * (rowsum - kc za') - za' * colsum,
   computed modulo 2^32: exact wherever the result fits in int32. */
#define POLYC_A_TAIL (((int64_t)(2 * MR * 4) + 63) / 64 * 64)
#define POLYC_B_TAIL (((int64_t)(2 * NR * 4) + 63) / 64 * 64)

static inline int64_t polyc_iround_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

static inline uint32_t polyc_load32(const void *p)
{
    uint32_t value;
    memcpy(&value, p, sizeof value);
    return value;
}

/* The step that cuts `total` into as few blocks of at most `most` as possible, of nearly equal
   sizes, multiples of `multiple`; with `nthr` threads, their count a multiple of nthr. */
static int64_t polyc_istep(int64_t total, int64_t most, int64_t multiple, int nthr)
{
    if (total <= 0) return most;
    int64_t blocks = (total + most - 1) / most;
    blocks = polyc_iround_up(blocks, nthr);
    return polyc_max(multiple, polyc_iround_up((total + blocks - 1) / blocks, multiple));
}

/* The sum of the four packed bytes of a group (a dot product of bytes, G == 4). */
static inline int32_t polyc_group_sum(uint32_t w)
{
    if ((polyc_pa)-1 < 0)  /* signed bytes: as unsigned after flipping their sign bits, minus 4 * 128 */
        w ^= 0x80808080u;
    uint32_t pairs = (w & 0x00ff00ffu) + ((w >> 8) & 0x00ff00ffu);
    const int32_t sum = (int32_t)((pairs + (pairs >> 16)) & 0xffffu);
    return (polyc_pa)-1 < 0 ? sum - 512 : sum;
}

/* Rows row0 .. row0+rows-1 (rows <= MR) of A, K block pc .. pc+kc-1, into one packed sliver. */
static void polyc_pack_a(const polyc_igemm_t *restrict g, const polyc_ta *restrict a, int64_t row0, int64_t rows,
                         int64_t pc, int64_t kc, unsigned char *restrict dst)
{
    int32_t *restrict tail = (int32_t *)dst;
    polyc_pa *restrict p = (polyc_pa *)(dst + POLYC_A_TAIL);
    const int64_t kg = (kc + G - 1) / G;
    const int sums = g->need_rowsums;  /* without a zero point of B, t[i] multiplies zeros */
    for (int64_t i = 0; i < MR; i++) {
        int32_t sum = 0;
        int64_t k = 0;
        if (i < rows) {
            const polyc_ta *restrict row = a + g->a_m[row0 + i];
            if (G == 4 && sizeof(polyc_pa) == 1 && g->a_k_stride == 1) {
                /* a group of four values is one 32-bit word; the shift flips the sign bits */
                const polyc_ta *restrict src = row + g->a_k[pc];
                const uint32_t flip = POLYC_A_SHIFT != 0 ? 0x80808080u : 0u;
                for (; k + 4 <= kc; k += 4) {
                    const uint32_t w = polyc_load32(src + k) ^ flip;
                    memcpy(p + ((k / 4) * MR + i) * 4, &w, 4);
                    if (sums)
                        sum += polyc_group_sum(w);
                }
            } else if (g->a_k_stride == 1) {
                /* a group at a time, its G values stored together */
                const polyc_ta *restrict src = row + g->a_k[pc];
                for (; k + G <= kc; k += G) {
                    polyc_pa group[G];
                    for (int t = 0; t < G; t++) {
                        const int32_t v = (int32_t)src[k + t] + POLYC_A_SHIFT;
                        group[t] = (polyc_pa)v;
                        sum += v;
                    }
                    memcpy(p + ((k / G) * MR + i) * G, group, sizeof group);
                }
            } else if (g->a_k_stride > 0) {
                const polyc_ta *restrict src = row + g->a_k[pc];
                const int64_t step = g->a_k_stride;
                for (; k < kc - kc % G; k++) {
                    const int32_t v = (int32_t)src[k * step] + POLYC_A_SHIFT;
                    p[((k / G) * MR + i) * G + k % G] = (polyc_pa)v;
                    sum += v;
                }
            }
            for (; k < kc; k++) {
                const int32_t v = (int32_t)row[g->a_k[pc + k]] + POLYC_A_SHIFT;
                p[((k / G) * MR + i) * G + k % G] = (polyc_pa)v;
                sum += v;
            }
        }
        for (; k < kg * G; k++)
            p[((k / G) * MR + i) * G + k % G] = 0;
        const int32_t za = i < rows ? g->za[row0 + i] : 0;
        tail[i] = za;
        tail[MR + i] = (int32_t)((uint32_t)sum - (uint32_t)kc * (uint32_t)za);
    }
}

/* Columns col0 .. col0+cols-1 (cols <= NR) of B, K block pc .. pc+kc-1, into one packed sliver. */
static void polyc_pack_b(const polyc_igemm_t *restrict g, const polyc_tb *restrict b, int64_t col0, int64_t cols,
                         int64_t pc, int64_t kc, unsigned char *restrict dst)
{
    int32_t *restrict tail = (int32_t *)dst;
    int32_t *restrict cs = tail + NR;
    polyc_pb *restrict p = (polyc_pb *)(dst + POLYC_B_TAIL);
    const int64_t kg = (kc + G - 1) / G;
    for (int64_t j = 0; j < NR; j++) {
        tail[j] = j < cols ? g->zb[col0 + j] : 0;
        cs[j] = 0;
    }
    if (cols == NR && g->b_n_stride == 1) {
        /* rows of B along N (weights stored K x N): G rows at a time, interleaved */
        const polyc_tb *restrict base = b + g->b_n[col0];
        for (int64_t q = 0; q < kg; q++) {
            const polyc_tb *rows[G];
            int present[G];
            for (int t = 0; t < G; t++) {
                present[t] = q * G + t < kc;
                rows[t] = present[t] ? base + g->b_k[pc + q * G + t] : base;
            }
            polyc_pb *restrict out = p + q * NR * G;
#if defined(__SSE2__)
            if (G == 4 && sizeof(polyc_pb) == 1 && NR % 16 == 0) {
                const __m128i flip = _mm_set1_epi8(POLYC_B_SHIFT != 0 ? (char)0x80 : 0);
                for (int64_t j = 0; j < NR; j += 16) {
                    __m128i r[4];
                    for (int t = 0; t < 4; t++)
                        r[t] = present[t] ? _mm_xor_si128(_mm_loadu_si128((const __m128i *)(rows[t] + j)), flip)
                                          : _mm_setzero_si128();
                    const __m128i lo01 = _mm_unpacklo_epi8(r[0], r[1]), hi01 = _mm_unpackhi_epi8(r[0], r[1]);
                    const __m128i lo23 = _mm_unpacklo_epi8(r[2], r[3]), hi23 = _mm_unpackhi_epi8(r[2], r[3]);
                    _mm_storeu_si128((__m128i *)(out + j * 4), _mm_unpacklo_epi16(lo01, lo23));
                    _mm_storeu_si128((__m128i *)(out + j * 4 + 16), _mm_unpackhi_epi16(lo01, lo23));
                    _mm_storeu_si128((__m128i *)(out + j * 4 + 32), _mm_unpacklo_epi16(hi01, hi23));
                    _mm_storeu_si128((__m128i *)(out + j * 4 + 48), _mm_unpackhi_epi16(hi01, hi23));
                }
                if (g->need_colsums) {
#if defined(POLYC_DOT4)
                    /* each column's four packed values, summed by the dot product with ones */
                    const __m128i ones = _mm_set1_epi8(1);
                    for (int64_t j = 0; j < NR; j += 4)
                        _mm_storeu_si128((__m128i *)(cs + j),
                                         POLYC_DOT4(_mm_loadu_si128((const __m128i *)(cs + j)), ones,
                                                    _mm_loadu_si128((const __m128i *)(out + j * 4))));
#else
                    for (int t = 0; t < 4; t++)
                        if (present[t])
                            for (int64_t j = 0; j < NR; j++)
                                cs[j] += (int32_t)(polyc_pb)((int32_t)rows[t][j] + POLYC_B_SHIFT);
#endif
                }
                continue;
            }
#endif
#if defined(__AVX2__)
            if (G == 2 && sizeof(polyc_pb) == 2 && POLYC_B_SHIFT == 0 && NR % 16 == 0) {
                /* two rows widened to int16 and interleaved, 16 columns at a time */
                for (int64_t j = 0; j < NR; j += 16) {
                    __m256i r[2];
                    for (int t = 0; t < 2; t++) {
                        const __m128i bytes = present[t] ? _mm_loadu_si128((const __m128i *)(rows[t] + j))
                                                         : _mm_setzero_si128();
                        r[t] = (polyc_tb)-1 < 0 ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes);
                    }
                    const __m256i lo = _mm256_unpacklo_epi16(r[0], r[1]), hi = _mm256_unpackhi_epi16(r[0], r[1]);
                    _mm256_storeu_si256((__m256i *)(out + j * 2), _mm256_permute2x128_si256(lo, hi, 0x20));
                    _mm256_storeu_si256((__m256i *)(out + j * 2 + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
                }
                if (g->need_colsums)
                    for (int t = 0; t < 2; t++)
                        if (present[t])
                            for (int64_t j = 0; j < NR; j++)
                                cs[j] += (int32_t)rows[t][j];
                continue;
            }
#endif
            for (int t = 0; t < G; t++) {
                if (!present[t]) {
                    for (int64_t j = 0; j < NR; j++) out[j * G + t] = 0;
                    continue;
                }
                for (int64_t j = 0; j < NR; j++) {
                    const int32_t v = (int32_t)rows[t][j] + POLYC_B_SHIFT;
                    out[j * G + t] = (polyc_pb)v;
                    cs[j] += v;
                }
            }
        }
        return;
    }
    for (int64_t j = 0; j < NR; j++) {
        int64_t k = 0;
        if (j < cols) {
            const polyc_tb *restrict column = b + g->b_n[col0 + j];
            if (G == 4 && sizeof(polyc_pb) == 1 && g->b_k_stride == 1) {
                /* B stored N x K (transposed): a group of four values is one 32-bit word */
                const polyc_tb *restrict src = column + g->b_k[pc];
                const uint32_t flip = POLYC_B_SHIFT != 0 ? 0x80808080u : 0u;
                for (; k + 4 <= kc; k += 4) {
                    const uint32_t w = polyc_load32(src + k) ^ flip;
                    memcpy(p + ((k / 4) * NR + j) * 4, &w, 4);
                    for (int t = 0; t < 4; t++)
                        cs[j] += (int32_t)(polyc_pb)(w >> (8 * t));
                }
            }
            for (; k < kc; k++) {
                const int32_t v = (int32_t)column[g->b_k[pc + k]] + POLYC_B_SHIFT;
                p[((k / G) * NR + j) * G + k % G] = (polyc_pb)v;
                cs[j] += v;
            }
        }
        for (; k < kg * G; k++)
            p[((k / G) * NR + j) * G + k % G] = 0;
    }
}

/* Writes an mr x nr block of sums of packed products (row stride NR in `block`) to C, corrected
   for the zero points and shifts (see above), added to C (beta) or replacing it. */
static void polyc_write_block(const int32_t *restrict block, const unsigned char *restrict ap,
                              const unsigned char *restrict bp, int32_t *restrict c, const int64_t *restrict c_m,
                              const int64_t *restrict c_n, int64_t mr, int64_t nr, int beta, int corrected)
{
    const int32_t *restrict at = (const int32_t *)ap, *restrict bt = (const int32_t *)bp;
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            uint32_t v = (uint32_t)block[i * NR + j];
            if (corrected)
                v -= (uint32_t)bt[j] * (uint32_t)at[MR + i] + (uint32_t)at[i] * (uint32_t)bt[NR + j];
            int32_t *restrict to = c + c_m[i] + c_n[j];
            *to = (int32_t)(beta ? (uint32_t)*to + v : v);
        }
}
