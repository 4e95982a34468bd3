/* POLYC_QDW_BLOCK outputs along a run of the shifted plane from `at`: their int32 sums over
   every tap (vectors of the compiler's vector extension, kept in registers), then ONNX's
   requantization as onnxruntime computes it: the bias added in int32, one float32 product,
   rounded half to even, saturated to [low, high] (a folded Relu or Clip narrows them). */
static inline void polyc_qdw_block(const int16_t *restrict at, const int64_t *restrict tap, int64_t taps,
                                   const polyc_qw *restrict w, int32_t bias, float scale, polyc_qy *restrict to)
{
    polyc_qdw_sums sums = {0};
    for (int64_t t = 0; t < taps; t++) {
        polyc_qdw_values values;
        memcpy(&values, at + tap[t], sizeof values);
        sums += __builtin_convertvector(values, polyc_qdw_sums) * (int32_t)w[t];
    }
    int32_t block[POLYC_QDW_BLOCK];
    memcpy(block, &sums, sizeof block);
    /* in vectors of the machine's width; rounded by adding 1.5 * 2^23, whose bits the sum's
       exceed by the value rounded half to even (exact for values this small, after the
       saturation; saturating before rounding is the same, the bounds being integers) */
    const polyc_qdw_floats zero = {0};
    const polyc_qdw_ints low = (polyc_qdw_ints)(zero + (float)(POLYC_QDW_LOW - POLYC_QDW_ZY));
    const polyc_qdw_ints high = (polyc_qdw_ints)(zero + (float)(POLYC_QDW_HIGH - POLYC_QDW_ZY));
    for (int64_t h = 0; h < POLYC_QDW_BLOCK; h += POLYC_QDW_LANES) {
        polyc_qdw_ints part;
        memcpy(&part, block + h, sizeof part);
        polyc_qdw_floats v = __builtin_convertvector(part + bias, polyc_qdw_floats) * scale;
        const polyc_qdw_ints below = v < (float)(POLYC_QDW_LOW - POLYC_QDW_ZY);
        const polyc_qdw_ints above = v > (float)(POLYC_QDW_HIGH - POLYC_QDW_ZY);
        v = (polyc_qdw_floats)(((polyc_qdw_ints)v & ~(below | above)) | (below & low) | (above & high));
        v += 12582912.0f;
        const polyc_qdw_ints rounded = (polyc_qdw_ints)v - 0x4B400000 + POLYC_QDW_ZY;
        const polyc_qdw_narrow narrow = __builtin_convertvector(rounded, polyc_qdw_narrow);
        memcpy(to + h, &narrow, sizeof narrow);
    }
}

/* One channel of one image: its plane copied, shifted by the image's zero point (0 outside the
   padding box, as the padding's products do not count), into `shifted`, with the columns dealt
   into `sw` phases (phase p holds the columns p, p + sw, ...), so that every tap of a strided
   row reads consecutive values (tap t of output column o at shifted[row + tap[t] + o]); then each output row in blocks of POLYC_QDW_BLOCK columns, its
   int32 sums in registers through every tap, requantized and stored once. */
static void polyc_qdw_plane(const polyc_qdw_t *restrict g, int64_t b, int64_t c, int16_t *restrict shifted,
                            polyc_qy *restrict run)
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
        if (g->sw == 2 && !g->flat) {
            /* both phases at once, a vector of the line's values split into its even and odd
               ones (past the phases' ends into their margins, from the line's margin) */
            int16_t *restrict even = shifted + r * g->pitch, *restrict odd = even + g->phase;
            const int64_t count = (g->columns + 1) / 2;
            for (int64_t j0 = 0; j0 < count; j0 += 16) {
                polyc_qdw_pairs pairs;
                memcpy(&pairs, line + 2 * j0, sizeof pairs);
                const polyc_qdw_halves evens = __builtin_shufflevector(pairs, pairs, POLYC_QDW_EVENS);
                const polyc_qdw_halves odds = __builtin_shufflevector(pairs, pairs, POLYC_QDW_ODDS);
                memcpy(even + j0, &evens, sizeof evens);
                memcpy(odd + j0, &odds, sizeof odds);
            }
            continue;
        }
        for (int64_t p = 0; p < g->sw; p++) {
            int16_t *restrict phase = shifted + p * g->phase + r * g->pitch;
            const int64_t count = (g->columns - p + g->sw - 1) / g->sw;
            /* in whole vectors, past the row's end into its margin where it has one */
            const int64_t whole = g->flat ? count / POLYC_QDW_DEAL * POLYC_QDW_DEAL : count;
            int64_t j0 = 0;
            for (; j0 < whole; j0 += POLYC_QDW_DEAL) {
                const int16_t *restrict source = line + p + j0 * g->sw;
                if (g->sw == 2) {
#pragma omp simd
                    for (int64_t t = 0; t < POLYC_QDW_DEAL; t++) phase[j0 + t] = source[2 * t];
                } else {
                    for (int64_t t = 0; t < POLYC_QDW_DEAL; t++) phase[j0 + t] = source[t * g->sw];
                }
            }
            for (; j0 < count; j0++) phase[j0] = line[p + j0 * g->sw];
        }
    }
    const polyc_qw *restrict w = g->w + c * POLYC_QDW_TAPS;
    const int32_t bias = g->bias != NULL ? g->bias[c] : 0;
    const float scale = g->scale[g->scale_step * c];
    polyc_qy *restrict out = g->out + (b * g->c + c) * g->oh * g->ow;
    if (g->flat) {
        /* The plane as one run: output (oh, ow) at f = oh * sh * pitch + ow reads tap t at
           shifted[f + tap[t]] as in a row, so blocks run on through the rows' ends (the
           outputs past a row's end are computed and dropped), which fills the vectors where
           the rows are short. */
        const int64_t span = (g->oh - 1) * g->sh * g->pitch + g->ow;
        for (int64_t f0 = 0; f0 < span; f0 += POLYC_QDW_BLOCK)
            polyc_qdw_block(shifted + f0, g->tap, POLYC_QDW_TAPS, w, bias, scale, run + f0);
        for (int64_t oh = 0; oh < g->oh; oh++)
            memcpy(out + oh * g->ow, run + oh * g->sh * g->pitch, (size_t)POLYC_QDW_OW * sizeof(polyc_qy));
        return;
    }
    for (int64_t oh = 0; oh < g->oh; oh++) {
        for (int64_t o0 = 0; o0 < g->ow; o0 += POLYC_QDW_BLOCK) {
            polyc_qy values[POLYC_QDW_BLOCK];
            polyc_qdw_block(shifted + oh * g->sh * g->pitch + o0, g->tap, POLYC_QDW_TAPS, w, bias, scale, values);
            if (o0 + POLYC_QDW_BLOCK <= g->ow)  /* (a copy of known length, which the compiler inlines) */
                memcpy(out + oh * g->ow + o0, values, sizeof values);
            else
                memcpy(out + oh * g->ow + o0, values, (size_t)(g->ow - o0) * sizeof(polyc_qy));
        }
    }
}
