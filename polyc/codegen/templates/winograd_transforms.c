
/* Tile `tile`'s image, row and column of tiles. */
static inline void polyc_wg_tile(const polyc_wg_t *g, int64_t tile, int64_t *b, int64_t *ty, int64_t *tx)
{
    *b = tile / (g->th * g->tw);
    *ty = tile / g->tw % g->th;
    *tx = tile % g->tw;
}

/* Where U[xi]'s block of output channels f0 <= f < f0 + fb starts: each block is its own
   [c][width] rows (width: fb, or what the last block has), so that a register block's steps
   read consecutive rows.  With U[xi][c][f], rows F apart, an Intel core's prefetchers fell
   behind, and resnet18's 256 -> 256 layers at 14 x 14 and 128 -> 128 at 28 x 28 ran markedly
   slower than blocked (python -m benchmarks.onnx_segments resnet18). */
static inline float *polyc_wg_u_block(const polyc_wg_t *g, int xi, int64_t f0)
{
    return g->u + (size_t)xi * g->c * g->f + (size_t)f0 * g->c;
}

/* U[xi] = (G g G^T)[xi] for input channel c, all output channels (g: W[kh][kw][c][f]), in
   blocks of fb channels (polyc_wg_u_block), G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2],
   [0, 0, 1]]. */
static void polyc_wg_weights(const polyc_wg_t *g, int64_t c)
{
    const polyc_wv half = WSET1(0.5f);
    for (int64_t f = 0; f < g->f; f += POLYC_WG_LANES) {
        const int64_t f0 = f / g->fb * g->fb, width = polyc_min(g->fb, g->f - f0);
        polyc_wv w[3][3], t[4][3];
        for (int k = 0; k < 3; k++)
            for (int s = 0; s < 3; s++)
                w[k][s] = WLOAD(g->w + ((k * 3 + s) * g->c + c) * g->f + f);
        for (int s = 0; s < 3; s++) {
            const polyc_wv outer = WADD(w[0][s], w[2][s]);
            t[0][s] = w[0][s];
            t[1][s] = WMUL(half, WADD(outer, w[1][s]));
            t[2][s] = WMUL(half, WSUB(outer, w[1][s]));
            t[3][s] = w[2][s];
        }
        for (int i = 0; i < 4; i++) {
            const polyc_wv outer = WADD(t[i][0], t[i][2]);
            const polyc_wv u[4] = {t[i][0], WMUL(half, WADD(outer, t[i][1])), WMUL(half, WSUB(outer, t[i][1])), t[i][2]};
            for (int j = 0; j < 4; j++)
                WSTORE(polyc_wg_u_block(g, i * 4 + j, f0) + c * width + (f - f0), u[j]);
        }
    }
}

/* V[xi][t][c] = (B^T d B)[xi] for the chunk's tiles t, d the tile's 4 x 4 patch of the image
   (0 outside the box), B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]. */
static void polyc_wg_input(const polyc_wg_t *g, float *restrict v, int64_t chunk)
{
    const int64_t t0 = chunk * g->tb, tn = polyc_min(g->tb, g->tiles - t0);
    const polyc_wv zero = WSET1(0.0f);
    for (int64_t t = 0; t < tn; t++) {
        int64_t b, ty, tx;
        polyc_wg_tile(g, t0 + t, &b, &ty, &tx);
        const float *rows[4], *image = g->in + b * g->ih * g->iw * g->c;
        int64_t cols[4];
        for (int a = 0; a < 4; a++) {
            const int64_t p = 2 * ty + a + g->off_h, q = 2 * tx + a + g->off_w;
            rows[a] = p >= g->lo_h && p < g->hi_h ? image + p * g->iw * g->c : NULL;
            cols[a] = q >= g->lo_w && q < g->hi_w ? q * g->c : -1;
        }
        for (int64_t c = 0; c < g->c; c += POLYC_WG_LANES) {
            polyc_wv d[4][4], e[4][4];
            for (int a = 0; a < 4; a++)
                for (int s = 0; s < 4; s++)
                    d[a][s] = rows[a] != NULL && cols[s] >= 0 ? WLOAD(rows[a] + cols[s] + c) : zero;
            for (int s = 0; s < 4; s++) {
                e[0][s] = WSUB(d[0][s], d[2][s]);
                e[1][s] = WADD(d[1][s], d[2][s]);
                e[2][s] = WSUB(d[2][s], d[1][s]);
                e[3][s] = WSUB(d[1][s], d[3][s]);
            }
            for (int i = 0; i < 4; i++) {
                const polyc_wv x[4] = {WSUB(e[i][0], e[i][2]), WADD(e[i][1], e[i][2]),
                                       WSUB(e[i][2], e[i][1]), WSUB(e[i][1], e[i][3])};
                for (int j = 0; j < 4; j++)
                    WSTORE(v + ((size_t)(i * 4 + j) * g->tb + t) * g->c + c, x[j]);
            }
        }
    }
    /* The rows the products' last register block reads past the last tile: zeros. */
    const int64_t end = polyc_min(g->tb, (tn + POLYC_WG_R - 1) / POLYC_WG_R * POLYC_WG_R);
    for (int xi = 0; xi < 16; xi++)
        if (end > tn)
            memset(v + ((size_t)xi * g->tb + tn) * g->c, 0, (size_t)(end - tn) * g->c * sizeof(float));
}

/* M[t..t+R)[0, nv vectors) = V[t..t+R) U (rows of V at v, U's block at u: rows of nv vectors,
   M's rows at m). */
static inline __attribute__((always_inline)) void polyc_wg_block(const polyc_wg_t *g, const float *restrict v,
                                                                 const float *restrict u, float *restrict m,
                                                                 const int nv)
{
    polyc_wv acc[POLYC_WG_R][POLYC_WG_NV];
    for (int r = 0; r < POLYC_WG_R; r++)
        for (int k = 0; k < nv; k++)
            acc[r][k] = WSET1(0.0f);
    for (int64_t c = 0; c < g->c; c++) {
        polyc_wv b[POLYC_WG_NV];
        for (int k = 0; k < nv; k++)
            b[k] = WLOAD(u + c * nv * POLYC_WG_LANES + k * POLYC_WG_LANES);
        for (int r = 0; r < POLYC_WG_R; r++) {
            const polyc_wv a = WSET1(v[r * g->c + c]);
            for (int k = 0; k < nv; k++)
                acc[r][k] = WFMA(a, b[k], acc[r][k]);
        }
    }
    for (int r = 0; r < POLYC_WG_R; r++)
        for (int k = 0; k < nv; k++)
            WSTORE(m + r * g->fb + k * POLYC_WG_LANES, acc[r][k]);
}

/* The 16 products of chunk `chunk`, whose V is at v, for output-channel block fblock, into
   M[xi][t][fb] (whole register blocks: the rows past the chunk's last tile are zeros, their M
   rows unused). */
static void polyc_wg_products(const polyc_wg_t *g, const float *restrict v, float *restrict m, int64_t chunk,
                              int64_t fblock)
{
    const int64_t f0 = fblock * g->fb, tn = polyc_min(g->tb, g->tiles - chunk * g->tb);
    const int nv = (int)(polyc_min(g->fb, g->f - f0) / POLYC_WG_LANES);
    for (int xi = 0; xi < 16; xi++) {
        const float *vx = v + (size_t)xi * g->tb * g->c, *ux = polyc_wg_u_block(g, xi, f0);
        float *mx = m + (size_t)xi * g->tb * g->fb;
        for (int64_t t = 0; t < tn; t += POLYC_WG_R) {
            switch (nv) {  /* a register block per vector count, its loops unrolled */
#if POLYC_WG_NV >= 4
            case 4: polyc_wg_block(g, vx + t * g->c, ux, mx + t * g->fb, 4); break;
#endif
#if POLYC_WG_NV >= 3
            case 3: polyc_wg_block(g, vx + t * g->c, ux, mx + t * g->fb, 3); break;
#endif
            case 2: polyc_wg_block(g, vx + t * g->c, ux, mx + t * g->fb, 2); break;
            default: polyc_wg_block(g, vx + t * g->c, ux, mx + t * g->fb, 1); break;
            }
        }
    }
}

/* Y = A^T M A for the chunk's tiles and the block's channels, A^T = [[1, 1, 1, 0], [0, 1, -1, -1]];
   the old output added (+=), the epilogue in registers where there is one; the outputs past
   the last row or column of the output are dropped. */
static void polyc_wg_output(const polyc_wg_t *g, const float *restrict m, int64_t chunk, int64_t fblock)
{
    const int64_t t0 = chunk * g->tb, tn = polyc_min(g->tb, g->tiles - t0), f0 = fblock * g->fb;
    const int64_t nf = polyc_min(g->fb, g->f - f0);
    for (int64_t t = 0; t < tn; t++) {
        int64_t b, ty, tx;
        polyc_wg_tile(g, t0 + t, &b, &ty, &tx);
        for (int64_t k = 0; k < nf; k += POLYC_WG_LANES) {
            polyc_wv s[2][4];
            for (int j = 0; j < 4; j++) {
                const polyc_wv m0 = WLOAD(m + ((size_t)(0 * 4 + j) * g->tb + t) * g->fb + k);
                const polyc_wv m1 = WLOAD(m + ((size_t)(1 * 4 + j) * g->tb + t) * g->fb + k);
                const polyc_wv m2 = WLOAD(m + ((size_t)(2 * 4 + j) * g->tb + t) * g->fb + k);
                const polyc_wv m3 = WLOAD(m + ((size_t)(3 * 4 + j) * g->tb + t) * g->fb + k);
                s[0][j] = WADD(WADD(m0, m1), m2);
                s[1][j] = WSUB(WSUB(m1, m2), m3);
            }
            for (int i = 0; i < 2; i++) {
                const int64_t oy = 2 * ty + i;
                if (oy >= g->oh)
                    break;
                const polyc_wv y[2] = {WADD(WADD(s[i][0], s[i][1]), s[i][2]), WSUB(WSUB(s[i][1], s[i][2]), s[i][3])};
                for (int j = 0; j < 2; j++) {
                    const int64_t ox = 2 * tx + j;
                    if (ox >= g->ow)
                        break;
                    const int64_t e = ((b * g->oh + oy) * g->ow + ox) * g->f + f0 + k;
                    polyc_wv a = y[j];
                    if (!g->init)
                        a = WADD(WLOAD(g->out + e), a);
#if POLYC_WG_REGISTER_EPILOGUE
                    a = polyc_epilogue_vector(g, a, f0 + k, e);
#endif
                    WSTORE(g->out + e, a);
                }
            }
        }
    }
}
