/* One channel of one image: its plane copied, shifted by the image's zero point (0 outside the
   padding box, as the padding's products do not count), into `shifted`, with the columns dealt
   into `sw` phases (phase p holds the columns p, p + sw, ...), so that every tap of a strided
   row reads consecutive values; then each output row in blocks of POLYC_QDW_BLOCK columns, its
   int32 sums in registers through every tap, requantized and stored once. */
static void polyc_qdw_plane(const polyc_qdw_t *restrict g, int64_t b, int64_t c, int16_t *restrict shifted)
{
    const polyc_qx *restrict in = g->in + (b * g->c + c) * g->ih * g->iw;
    for (int64_t r = 0; r < g->rows; r++) {
        const int64_t y = r + g->first_row;
        const int row_inside = y >= g->lo_h && y < g->hi_h;
        for (int64_t q = 0; q < g->columns; q++) {
            const int64_t x = q + g->first_column;
            const int inside = row_inside && x >= g->lo_w && x < g->hi_w;
            shifted[(q % g->sw) * g->phase + r * g->pitch + q / g->sw] =
                inside ? (int16_t)((int32_t)in[y * g->iw + x] - POLYC_QDW_ZX) : 0;
        }
    }
    const polyc_qw *restrict w = g->w + c * g->kh * g->kw;
    const int32_t bias = g->bias != NULL ? g->bias[c] : 0;
    const float scale = g->scale[g->scale_step * c];
    polyc_qy *restrict out = g->out + (b * g->c + c) * g->oh * g->ow;
    for (int64_t oh = 0; oh < g->oh; oh++) {
        for (int64_t o0 = 0; o0 < g->ow; o0 += POLYC_QDW_BLOCK) {
            int32_t sums[POLYC_QDW_BLOCK];
            for (int64_t t = 0; t < POLYC_QDW_BLOCK; t++) sums[t] = bias;
            for (int64_t i = 0; i < g->kh; i++) {
                const int16_t *restrict row = shifted + (oh * g->sh + i * g->dh) * g->pitch + o0;
                for (int64_t j = 0; j < g->kw; j++) {
                    const int64_t along = j * g->dw;
                    const int16_t *restrict source = row + (along % g->sw) * g->phase + along / g->sw;
                    const int32_t weight = (int32_t)w[i * g->kw + j];
#pragma omp simd
                    for (int64_t t = 0; t < POLYC_QDW_BLOCK; t++) sums[t] += weight * (int32_t)source[t];
                }
            }
            /* ONNX's requantization as onnxruntime computes it: one float32 product, rounded
               half to even, saturated to [low, high] (a folded Relu or Clip narrows them). */
            polyc_qy values[POLYC_QDW_BLOCK];
#pragma omp simd
            for (int64_t t = 0; t < POLYC_QDW_BLOCK; t++) {
                float v = __builtin_rintf((float)sums[t] * scale) + (float)POLYC_QDW_ZY;
                v = v < (float)POLYC_QDW_LOW ? (float)POLYC_QDW_LOW : v;
                v = v > (float)POLYC_QDW_HIGH ? (float)POLYC_QDW_HIGH : v;
                values[t] = (polyc_qy)(int32_t)v;
            }
            const int64_t count = polyc_min(POLYC_QDW_BLOCK, g->ow - o0);
            memcpy(out + oh * g->ow + o0, values, (size_t)count * sizeof(polyc_qy));
        }
    }
}
