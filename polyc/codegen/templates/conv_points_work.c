
/* A block written through `block` (RF x NR): each point q0 + j with out_p >= 0, rows < `rows`. */
static void polyc_conv_scatter(const polyc_conv_t *restrict g, const T *restrict block, int64_t b, int64_t f0,
                               int64_t rows, int64_t q0, int64_t n, int beta)
{
    const int64_t *restrict out_p = g->out_p + q0;
    for (int64_t i = 0; i < rows; i++) {
        T *restrict o = g->out + g->out_b[b] + g->out_f[f0 + i];
        const T *restrict c = block + i * POLYC_NR;
        for (int64_t j = 0; j < n; j++)
            if (out_p[j] >= 0)
                o[out_p[j]] = beta ? o[out_p[j]] + c[j] : c[j];
    }
}

/* Tile t of the points of item b, channel blocks fb0 <= fb < fb1. */
static void polyc_conv_tile(const polyc_conv_t *restrict g, int64_t b, int64_t t, int64_t fb0, int64_t fb1,
                            T *restrict panel, int init)
{
    const int64_t q0 = t * POLYC_NR, n = polyc_min(POLYC_NR, g->npoints - q0);
    const T *restrict bp;
    const int64_t *restrict roff;
    if (g->direct) {  /* consecutive points are consecutive in the image: read it in place */
        bp = g->in + g->in_b[b] + g->in_p[q0];
        roff = g->in_r;
    } else {  /* gather the tile's rows of B into a panel, zero past n */
        const T *restrict in = g->in + g->in_b[b];
        const int64_t *restrict in_p = g->in_p + q0;
        const unsigned char *restrict vstep = g->vstep + q0 / POLYC_LANES;
        for (int64_t r = 0; r < g->nred; r++) {
            const T *restrict src = in + g->in_r[r];
            T *restrict dst = panel + r * POLYC_NR;
            int64_t j = 0;
#if POLYC_PACK_STEPPED
            /* Vectors of points a stride of 1 or 2 apart in the image (the points of a strided
               convolution along a row) are moved by vector loads instead of a gather. */
            for (; j + POLYC_LANES <= n; j += POLYC_LANES) {
                if (vstep[j / POLYC_LANES])
                    polyc_pack_stepped(dst + j, src + in_p[j], vstep[j / POLYC_LANES]);
                else
                    for (int64_t i = j; i < j + POLYC_LANES; i++) dst[i] = src[in_p[i]];
            }
#else
            (void)vstep;
#endif
            for (; j < n; j++) dst[j] = src[in_p[j]];
            for (j = n; j < POLYC_NR; j++) dst[j] = 0;
        }
        bp = panel;
        roff = g->panel_r;
    }
    /* The weights of the item's group; channel f0 + i at step r: wp[f0 * w_row + i * w_row + r * w_step]
       in W itself, wp[f0 * nred + i + r * RF] packed (w_row 1, w_step RF). */
    const T *restrict wp = g->wpack ? g->wpack + g->wg_b[b] * g->wg_stride : g->w + g->w_g[g->wg_b[b]];
    const int64_t channel = g->wpack ? g->nred : g->w_row;
    /* Write-back: 1, outputs consecutive; 2, consecutive but for dropped points (AVX-512
       compresses the vectors); 0, through a buffer. */
    const int64_t p0 = g->tile_p[t], p1 = g->tile_p[t + 1];
    const int mode = g->unit[t] ? 1 : POLYC_COMPRESS && g->packed_out ? 2 : 0;
    const int64_t first = mode == 1 ? g->out_p[q0] : p0 < g->nout ? g->out_c[p0] : 0;
    const uint32_t *restrict vmask = g->vmask + q0 / POLYC_LANES;
    T block[POLYC_RF * POLYC_NR] __attribute__((aligned(64)));
    int64_t row_off[POLYC_RF];
    for (int64_t fb = fb0; fb < fb1; fb++) {
        const int64_t f0 = fb * POLYC_RF, rows = polyc_min(POLYC_RF, g->nf - f0);
        for (int64_t i = 0; i < rows; i++)
            row_off[i] = g->out_b[b] + g->out_f[f0 + i] + first;
        polyc_conv_block(g->nred, wp + f0 * channel, g->w_step, g->w_row, bp, roff, n, g->out, row_off, rows, !init,
                         mode, vmask, block);
        if (mode == 0)
            polyc_conv_scatter(g, block, b, f0, rows, q0, n, !init);
        if (POLYC_HAS_EPILOGUE)
            polyc_epilogue(g, b, f0, rows, p0, p1);
    }
}

/* Packs channel block x (over all groups: [group][channel block]) of the weights into
   g->wpack as [r][RF], zero rows past the last channel. */
static void polyc_conv_pack(const polyc_conv_t *restrict g, const T *restrict w, const int64_t *restrict w_g,
                            const int64_t *restrict w_f, const int64_t *restrict w_r, int64_t x)
{
    const int64_t nred = g->nred, wg = x / g->nfb, fb = x % g->nfb;
    T *restrict dst = (T *)g->wpack + x * nred * POLYC_RF;
    /* RF source rows read side by side and dst written in order: one pass over each (row by
       row, dst was written RF times over, at a third of the speed). */
    const T *src[POLYC_RF];
    const int64_t rows = polyc_min(POLYC_RF, g->nf - fb * POLYC_RF);
    for (int64_t i = 0; i < rows; i++)
        src[i] = w + w_g[wg] + w_f[fb * POLYC_RF + i];
    for (int64_t r = 0; r < nred; r++) {
        const int64_t at = w_r[r];
        for (int64_t i = 0; i < POLYC_RF; i++)
            dst[r * POLYC_RF + i] = i < rows ? src[i][at] : (T)0;
    }
}

/* Weights in the usual layout (each channel's reduction points consecutive, the rows evenly
   spaced: W(F, C, KH, KW)) are read in place: RF row streams of broadcasts instead of one, and
   no packing, which reads all the weights once more and is a visible share of a 256 -> 256
   3x3 convolution at 14 x 14 (python -m benchmarks.onnx_segments resnet18).  Also chooses
   the work items: (item, tile, chunk of channel blocks), chunks only when there are few
   tiles.  Returns whether the weights are in place. */
static int polyc_conv_plan(polyc_conv_t *restrict g, int nthr)
{
    const int64_t *restrict w_f = g->w_f;
    const int64_t w_row = g->nf > 1 ? w_f[1] - w_f[0] : 0;
    int in_place = g->nred > 0 && w_f[0] == 0 && g->w_r[0] == 0 && polyc_steps_by_one(g->w_r, g->nred);
    for (int64_t f = 0; in_place && f < g->nf; f++)
        in_place = w_f[f] == f * w_row;
    g->w_step = in_place ? 1 : POLYC_RF;
    g->w_row = in_place ? w_row : 1;
    int64_t chunk = CHUNK_BLOCKS;
    if (chunk <= 0) {
        const int64_t tiles = g->nitems * g->ntiles, wanted = 4 * (int64_t)nthr;
        const int64_t chunks = tiles >= wanted ? 1 : polyc_min(g->nfb, (wanted + tiles - 1) / tiles);
        chunk = (g->nfb + chunks - 1) / chunks;
    }
    g->take_size = chunk;
    g->takes = (g->nfb + chunk - 1) / chunk;
    g->nwork = g->nitems * g->ntiles * g->takes;
    return in_place;
}

/* Work item x: item b, tile t, chunk c of channel blocks. */
static void polyc_conv_work(const polyc_conv_t *restrict g, int64_t x, T *restrict panel, int init)
{
    const int64_t c = x % g->takes, t = x / g->takes % g->ntiles, b = x / g->takes / g->ntiles;
    polyc_conv_tile(g, b, t, c * g->take_size, polyc_min(g->nfb, (c + 1) * g->take_size), panel, init);
}
