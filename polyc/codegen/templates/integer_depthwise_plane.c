/* One channel of one image: its plane copied, shifted by the image's zero point (0 outside the
   padding box, as the padding's products do not count), into `shifted`, with the columns dealt
   into `sw` phases (phase p holds the columns p, p + sw, ...), so that every tap of a strided
   row reads consecutive values (tap t of output column o at shifted[row + tap[t] + o]); then each output row in blocks of POLYC_QDW_BLOCK columns, its
   int32 sums in registers through every tap, requantized and stored once. */
static void polyc_qdw_plane(const polyc_qdw_t *restrict g, int64_t b, int64_t c, int16_t *restrict shifted)
{
    const polyc_qx *restrict in = g->in + (b * g->c + c) * g->ih * g->iw;
    /* the columns of a row inside the box: q = x - first_column for x in [lo_w, hi_w) */
    const int64_t q_lo = polyc_min(g->columns, polyc_max(0, g->lo_w - g->first_column));
    const int64_t q_hi = polyc_max(q_lo, polyc_min(g->columns, g->hi_w - g->first_column));
    int16_t *restrict line = shifted + g->sw * g->phase;  /* one row before it is dealt into phases */
    for (int64_t r = 0; r < g->rows; r++) {
        const int64_t y = r + g->first_row;
        int16_t *restrict to = g->sw == 1 ? shifted + r * g->pitch : line;
        if (y < g->lo_h || y >= g->hi_h) {
            for (int64_t q = 0; q < g->columns; q++) to[q] = 0;
        } else {
            const polyc_qx *restrict from = in + y * g->iw + g->first_column;
            for (int64_t q = 0; q < q_lo; q++) to[q] = 0;
#pragma omp simd
            for (int64_t q = q_lo; q < q_hi; q++) to[q] = (int16_t)((int32_t)from[q] - POLYC_QDW_ZX);
            for (int64_t q = q_hi; q < g->columns; q++) to[q] = 0;
        }
        if (g->sw == 1) continue;
        /* Dealt in whole vectors: the values past a phase's end that they write (from the line's
           margin) are read only for the block columns past the output row's end. */
        for (int64_t p = 0; p < g->sw; p++) {
            int16_t *restrict phase = shifted + p * g->phase + r * g->pitch;
            const int64_t count = (g->columns - p + g->sw - 1) / g->sw;
            for (int64_t j0 = 0; j0 < count; j0 += POLYC_QDW_DEAL) {
                const int16_t *restrict source = line + p + j0 * g->sw;
                if (g->sw == 2) {
#pragma omp simd
                    for (int64_t t = 0; t < POLYC_QDW_DEAL; t++) phase[j0 + t] = source[2 * t];
                } else {
                    for (int64_t t = 0; t < POLYC_QDW_DEAL; t++) phase[j0 + t] = source[t * g->sw];
                }
            }
        }
    }
    const polyc_qw *restrict w = g->w + c * POLYC_QDW_TAPS;
    const int32_t bias = g->bias != NULL ? g->bias[c] : 0;
    const float scale = g->scale[g->scale_step * c];
    polyc_qy *restrict out = g->out + (b * g->c + c) * g->oh * g->ow;
    for (int64_t oh = 0; oh < g->oh; oh++) {
        for (int64_t o0 = 0; o0 < g->ow; o0 += POLYC_QDW_BLOCK) {
            /* (vectors of the compiler's vector extension: one block's sums, which it keeps in
               registers of the machine's width through every tap) */
            polyc_qdw_sums sums = {0};
            const int16_t *restrict row = shifted + oh * g->sh * g->pitch + o0;
            for (int64_t t = 0; t < POLYC_QDW_TAPS; t++) {
                polyc_qdw_values values;
                memcpy(&values, row + g->tap[t], sizeof values);
                sums += __builtin_convertvector(values, polyc_qdw_sums) * (int32_t)w[t];
            }
            int32_t block[POLYC_QDW_BLOCK];
            memcpy(block, &sums, sizeof block);
            /* ONNX's requantization as onnxruntime computes it: the bias added in int32, one
               float32 product, rounded half to even, saturated to [low, high] (a folded Relu or
               Clip narrows them). */
            polyc_qy values[POLYC_QDW_BLOCK];
#pragma omp simd simdlen(POLYC_QDW_BLOCK)
            for (int64_t t = 0; t < POLYC_QDW_BLOCK; t++) {
                float v = __builtin_rintf((float)(block[t] + bias) * scale) + (float)POLYC_QDW_ZY;
                v = v < (float)POLYC_QDW_LOW ? (float)POLYC_QDW_LOW : v;
                v = v > (float)POLYC_QDW_HIGH ? (float)POLYC_QDW_HIGH : v;
                values[t] = (polyc_qy)(int32_t)v;
            }
            const int64_t count = polyc_min(POLYC_QDW_BLOCK, g->ow - o0);
            memcpy(out + oh * g->ow + o0, values, (size_t)count * sizeof(polyc_qy));
        }
    }
}
