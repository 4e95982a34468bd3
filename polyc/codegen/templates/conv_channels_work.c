
/* The pieces of tile t (n points) for steps r0 <= r < r1 (relative to r0): runs of steps
   with the points whose products they add (bit j: point j); into `pieces` (3 entries each, room
   for one per kernel tap), their number returned.  Without padding, one piece of every point;
   with it, a piece per run of kernel taps that the same points of the tile read inside the box
   (the points that read a tap in the padding add nothing, not even 0 * weight), none for taps
   no point reads there.  The points past the tile's end (copies of its last point, not stored)
   read what the last point reads. */
static int64_t polyc_conv_pieces(const polyc_conv_t *restrict g, int64_t t, int64_t n, int64_t r0, int64_t r1,
                                 int64_t *restrict pieces)
{
    if (g->tap_points == NULL) {
        pieces[0] = 0, pieces[1] = r1 - r0, pieces[2] = POLYC_ALL_POINTS;
        return r1 > r0;
    }
    const uint16_t *restrict points = g->tap_points + t * g->ntaps;
    const uint64_t copies = POLYC_ALL_POINTS & ~(((uint64_t)1 << n) - 1);
    const int64_t nchan = g->nchan;
    int64_t count = 0;
    for (int64_t tap = r0 / nchan; tap < g->ntaps && tap * nchan < r1;) {
        const uint16_t mask = points[tap];
        int64_t end = tap + 1;
        while (end < g->ntaps && end * nchan < r1 && points[end] == mask)
            end++;
        if (mask) {
            pieces[3 * count] = polyc_max(r0, tap * nchan) - r0;
            pieces[3 * count + 1] = polyc_min(r1, end * nchan) - r0;
            pieces[3 * count + 2] = (int64_t)(mask >> (n - 1) & 1 ? mask | copies : mask);
            count++;
        }
        tap = end;
    }
    return count;
}

/* Row 0 of channel block fb's weights for item group b (packed, or in place). */
static const T *polyc_conv_block_weights(const polyc_conv_t *restrict g, int64_t b, int64_t fb)
{
    return g->wpack ? g->wpack + g->wg_b[b] * g->wg_stride + fb * g->nred * POLYC_FBLOCK
                    : g->w + g->w_g[g->wg_b[b]] + g->w_f[fb * POLYC_FBLOCK];
}

/* Work item x: group b, channel blocks fb0 <= fb < fb1 (a chunk of them), tiles t0 <= t < t1
   (a run).  For each chunk of the reduction, every tile of the run is done for every channel
   block of the chunk, so the weights' slice (rchunk rows, the chunk's channels: one stretch of
   each row of W(kh, kw, c, f)) is read from memory once per run and then from L2. */
static void polyc_conv_work(const polyc_conv_t *restrict g, int64_t x, T *restrict panel, int init)
{
    (void)panel;
    const int64_t run = x % g->takes, chunk = x / g->takes % g->fchunks, b = x / g->takes / g->fchunks;
    const int64_t t0 = run * g->take_size, t1 = polyc_min(g->ntiles, t0 + g->take_size);
    const int64_t fb0 = chunk * g->fchunk_size, fb1 = polyc_min(g->nfb, fb0 + g->fchunk_size);
    const T *restrict in = g->in + g->in_b[b];
    const T *ip[POLYC_NR];
    int64_t oo[POLYC_NR];
    int64_t pieces[3 * (g->ntaps + 1)];  /* one per kernel tap at most (a VLA: ntaps is small) */
    /* The item's channels of an output point, and whether they are consecutive (see below). */
    const int64_t f_first = fb0 * POLYC_FBLOCK, f_last = polyc_min(g->nf, fb1 * POLYC_FBLOCK) - 1;
    const int64_t out_bytes = (g->out_f[f_last] - g->out_f[f_first] + 1) * (int64_t)sizeof(T);
    const int out_consecutive = g->out_f[f_last] - g->out_f[f_first] == f_last - f_first;
    int64_t r0 = 0;
    do {  /* at least once: an empty reduction still writes its zeros */
        const int64_t nr = polyc_min(g->rchunk, g->nred - r0);
        /* The weights to come: the next chunk's, or after the last the next item's first
           (taken next by this thread, mostly).  A model's weights come from memory (resnet18's
           512 -> 512 3x3 filters are 9.4 MB), and read only when their chunk starts, each
           chunk's first tile waits on them; so every kernel call prefetches its share of them,
           a line per step, as it computes (a burst of prefetches at each call did nothing). */
        const int64_t ahead_x = r0 + nr < g->nred ? x : x + 1, ahead_r0 = ahead_x == x ? r0 + nr : 0;
        const int64_t ahead_nr = polyc_min(g->rchunk, g->nred - ahead_r0), tiles = t1 - t0;
        const int64_t ahead_b = ahead_x / g->takes / g->fchunks;
        /* A tile whose points each read several lines reads a line of each point in turn, which
           the hardware's prefetchers do not follow: an NHWC 1x1 layer (96 -> 24 channels) whose
           image came from memory ran far below its speed from cache (mobilenet_v2's: python -m
           benchmarks.onnx_segments mobilenet_v2).  So when each step reads the next element (a
           chunk of one tap), more than a line per point, each tile's first kernel call
           prefetches, a line per step, the image of the tile one ahead (two for short chunks,
           whose tiles take less time than memory does) if its points' lines are mostly
           consecutive.  With a line per point the tiles read consecutive lines, and
           prefetching slowed a 16 -> 96 layer (the same command). */
        int64_t rlo = nr > 0 ? g->in_r[r0] : 0, rhi = rlo;  /* the chunk's range of in_r */
        for (int64_t r = r0 + 1; r < r0 + nr; r++)
            rlo = polyc_min(rlo, g->in_r[r]), rhi = polyc_max(rhi, g->in_r[r]);
        const int prefetch_image = nr > 0 && rhi - rlo + 1 == nr && nr * (int64_t)sizeof(T) > 64;
        const int64_t ahead_t = nr >= 64 ? 1 : 2;
        /* An image whose reduction steps read short runs along rows (a 3-channel NCHW image, as an
           image model's first layer reads it: runs of the taps along x, each within a line, one run
           per channel plane and kernel row) reads each tile's few lines from many rows, which the
           hardware's prefetchers do not follow from tile to tile.  So where the chunk has at most
           IMAGE_ROW_RUNS runs and none longer than a line, each tile prefetches the start of every
           run for the first and last point of the tile two ahead.  With its image and output from
           memory, mobilenet_v2's first layer (27 steps: 3 x 3 taps x 3 channels) and
           squeezenet1_1's ran faster so (python -m benchmarks.onnx_segments mobilenet_v2, and
           the same for squeezenet1_1). */
        int64_t row_starts[IMAGE_ROW_RUNS], row_runs = 0, longest_run = 0;
        if (!prefetch_image)
            for (int64_t r = r0, start = r0; r <= r0 + nr && row_runs <= IMAGE_ROW_RUNS; r++) {
                if (r < r0 + nr && r > r0 && g->in_r[r] == g->in_r[r - 1] + 1)
                    continue;
                if (r > r0) {  /* the run start..r-1 ends */
                    longest_run = polyc_max(longest_run, r - start);
                    if (row_runs < IMAGE_ROW_RUNS)
                        row_starts[row_runs] = g->in_r[start];
                    row_runs++;
                }
                start = r;
            }
        const int prefetch_rows = row_runs >= 2 && row_runs <= IMAGE_ROW_RUNS
                                  && longest_run * (int64_t)sizeof(T) <= 64;
        /* A tile's outputs are first written at the end of its first chunk, a burst of stores
           of NR points x the chunk's channels; where their lines come from memory (an early
           layer's output, a large batch's), the burst waits on them.  So with chunks of at least
           OUTPUT_PREFETCH_STEPS steps, whose tiles take far longer than a few prefetches, each
           tile asks, with the intent to write, for the output lines of the tile two ahead,
           which sped up resnet18's first layer (147 steps) at batch 1 and 8 (python -m
           benchmarks.onnx_segments resnet18 --batch 8).  With fewer steps the stores keep up:
           asking slowed a 16 -> 96 1x1 layer, and did not speed a 64 -> 128 one up. */
        const int prefetch_out = r0 == 0 && nr >= OUTPUT_PREFETCH_STEPS && out_consecutive && !g->stream_out;
        const int64_t ahead_fb0 = ahead_x / g->takes % g->fchunks * g->fchunk_size;
        const int64_t ahead_fb1 = polyc_min(g->nfb, ahead_fb0 + g->fchunk_size);
        for (int64_t t = t0; t < t1; t++) {
            const int64_t q0 = t * POLYC_NR, n = polyc_min(POLYC_NR, g->npoints - q0);
            int uniform = POLYC_POINT_STRIDE > 0 && n == POLYC_NR;  /* points POLYC_POINT_STRIDE apart */
            for (int64_t j = 0; j < POLYC_NR; j++) {
                ip[j] = in + g->in_p[q0 + polyc_min(j, n - 1)];
                oo[j] = j < n ? g->out_b[b] + g->out_p[q0 + j] : -1;
                uniform = uniform && ip[j] == ip[0] + j * POLYC_POINT_STRIDE;
            }
            const int64_t npieces = polyc_conv_pieces(g, t, n, r0, r0 + nr, pieces);
            if (prefetch_out && t + 2 < t1) {
                const int64_t qa = (t + 2) * POLYC_NR, na = polyc_min(POLYC_NR, g->npoints - qa);
                for (int64_t j = 0; j < na; j++) {
                    if (g->out_p[qa + j] < 0)
                        continue;
                    const char *o = (const char *)(g->out + g->out_f[f_first] + g->out_b[b] + g->out_p[qa + j]);
                    for (int64_t byte = 0; byte < out_bytes; byte += 64)
                        __builtin_prefetch(o + byte, 1, 3);
                }
            }
            if (prefetch_rows && t + 2 < t1) {
                const int64_t qa = (t + 2) * POLYC_NR, na = polyc_min(POLYC_NR, g->npoints - qa);
                const T *first = in + g->in_p[qa], *last = in + g->in_p[qa + na - 1];
                for (int64_t run = 0; run < row_runs; run++) {
                    __builtin_prefetch(first + row_starts[run], 0, 3);
                    __builtin_prefetch(last + row_starts[run], 0, 3);
                }
            }
            const char *ipf = NULL;
            int64_t nipf = 0;
            if (prefetch_image && t + ahead_t < t1) {
                const int64_t qa = (t + ahead_t) * POLYC_NR, na = polyc_min(POLYC_NR, g->npoints - qa);
                int64_t plo = g->in_p[qa], phi = g->in_p[qa];
                for (int64_t j = 1; j < na; j++)
                    plo = polyc_min(plo, g->in_p[qa + j]), phi = polyc_max(phi, g->in_p[qa + j]);
                const int64_t span = phi - plo + nr;  /* elements from the first point's to the last's end */
                if (span <= 2 * na * nr) {
                    ipf = (const char *)(in + plo + rlo);
                    nipf = polyc_min(nr, (span * (int64_t)sizeof(T) + 63) / 64);
                }
            }
            for (int64_t fb = fb0; fb < fb1; fb++) {
                const int64_t f0 = fb * POLYC_FBLOCK, nfc = polyc_min(POLYC_FBLOCK, g->nf - f0);
                const int64_t nfv = (nfc + POLYC_LANES - 1) / POLYC_LANES, tail = nfc - (nfv - 1) * POLYC_LANES;
                const T *restrict wp = polyc_conv_block_weights(g, b, fb);
                /* This call's share: the rows of the same block to come, split over the tiles. */
                const int64_t ahead_fb = ahead_fb0 + fb - fb0;
                const char *pf = NULL;
                int64_t npf = 0;
                if (ahead_x < g->nwork && ahead_fb < ahead_fb1) {
                    const int64_t row0 = ahead_nr * (t - t0) / tiles, row1 = ahead_nr * (t - t0 + 1) / tiles;
                    pf = (const char *)(polyc_conv_block_weights(g, ahead_b, ahead_fb) + (ahead_r0 + row0) * g->w_step);
                    npf = (row1 - row0) * POLYC_PF_LINES;
                }
                (uniform ? polyc_convc_block_uniform : polyc_convc_block)(
                    nfv, pieces, npieces, wp + r0 * g->w_step, g->w_step, ip, g->in_r + r0, g->out + g->out_f[f0],
                    oo, !init || r0 > 0, tail, pf, g->w_step * (int64_t)sizeof(T), npf, ipf, fb == fb0 ? nipf : 0,
                    g, f0, r0 + nr >= g->nred);
            }
        }
        r0 += g->rchunk;
    } while (r0 < g->nred);
    if (POLYC_HAS_EPILOGUE && !POLYC_REGISTER_EPILOGUE)
        for (int64_t t = t0; t < t1; t++)
            for (int64_t fb = fb0; fb < fb1; fb++)
                polyc_epilogue(g, b, fb * POLYC_FBLOCK, polyc_min(POLYC_FBLOCK, g->nf - fb * POLYC_FBLOCK),
                               t * POLYC_NR, polyc_min(g->npoints, (t + 1) * POLYC_NR));
}

/* Packs channel block x (over all groups: [group][channel block]) into g->wpack as [r][FBLOCK],
   zero columns past the last channel. */
static void polyc_conv_pack(const polyc_conv_t *restrict g, const T *restrict w, const int64_t *restrict w_g,
                            const int64_t *restrict w_f, const int64_t *restrict w_r, int64_t x)
{
    const int64_t nred = g->nred, wg = x / g->nfb, f0 = x % g->nfb * POLYC_FBLOCK;
    const int64_t nfc = polyc_min(POLYC_FBLOCK, g->nf - f0);
    T *restrict dst = (T *)g->wpack + x * nred * POLYC_FBLOCK;
    for (int64_t r = 0; r < nred; r++)
        for (int64_t i = 0; i < POLYC_FBLOCK; i++)
            dst[r * POLYC_FBLOCK + i] = i < nfc ? w[w_g[wg] + w_f[f0 + i] + w_r[r]] : (T)0;
}

/* The busiest thread's share of the work when the items of a split (chunks of `size` channel
   blocks x `runs` runs of tiles) are taken in order by whichever thread is free first, as the
   dynamic schedule hands them out; in channel vectors x tiles (a chunk with the last, partial
   block has fewer vectors). */
static double polyc_conv_busiest(const polyc_conv_t *restrict g, int64_t size, int64_t runs, int nthr)
{
    const int64_t chunks = (g->nfb + size - 1) / size, take = (g->ntiles + runs - 1) / runs;
    if (g->nitems * chunks * ((g->ntiles + take - 1) / take) > 16 * (int64_t)nthr) {
        /* Many items (a grouped convolution's groups): the busiest share is an even share
           within one item, and the plan, made on every call, need not hand them out. */
        double total = 0, largest = 0;
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t channels = polyc_min(g->nf, (c + 1) * size * POLYC_FBLOCK) - c * size * POLYC_FBLOCK;
            const double vectors = (double)((channels + POLYC_LANES - 1) / POLYC_LANES);
            total += vectors * (double)g->ntiles;
            largest = vectors * (double)take > largest ? vectors * (double)take : largest;
        }
        return total * (double)g->nitems / nthr + largest;
    }
    double load[nthr];
    for (int i = 0; i < nthr; i++)
        load[i] = 0;
    for (int64_t b = 0; b < g->nitems; b++)
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t channels = polyc_min(g->nf, (c + 1) * size * POLYC_FBLOCK) - c * size * POLYC_FBLOCK;
            const int64_t vectors = (channels + POLYC_LANES - 1) / POLYC_LANES;
            for (int64_t t0 = 0; t0 < g->ntiles; t0 += take) {
                int free = 0;
                for (int i = 1; i < nthr; i++)
                    free = load[i] < load[free] ? i : free;
                load[free] += (double)vectors * (double)(polyc_min(g->ntiles, t0 + take) - t0);
            }
        }
    double most = 0;
    for (int i = 0; i < nthr; i++)
        most = load[i] > most ? load[i] : most;
    return most;
}

/* Weights whose channels are consecutive within each block and whose reduction rows are evenly
   spaced are read in place (w_step: the rows' spacing); else packed (w_step FBLOCK).  Also
   chooses the work items: chunks of channel blocks x runs of tiles.  A split costs the longer
   of its busiest thread's arithmetic and its memory traffic (each run reads all the weights of
   its chunk, unless they fit in L2, where a thread's runs share them; each chunk reads the
   image once more) at `flops_per_byte`, the machine's balance, roughly.  When the weights come
   from memory (a model's weights do not stay in L3), a run per item on 2 threads of a 512 -> 64
   3x3 convolution at 7 x 7 read them 8 times; split by traffic alone, mobilenet_v2's 960 -> 160
   1x1 layer at 7 x 7 took chunks of 128 and 32 channels, one per thread, and gained little from
   the second thread (python -m benchmarks.onnx_segments mobilenet_v2).  Of the splits with at
   least one item per thread, one within 2% of the least cost and 5% of the least traffic among
   those, with the most items (up to 4 per thread, as threads come free unevenly).  Then the
   reduction chunk.  Returns whether the weights are in place. */
static int polyc_conv_plan(polyc_conv_t *restrict g, int nthr)
{
    const int64_t row = g->nred > 1 ? g->w_r[1] - g->w_r[0] : 0;
    int in_place = g->nred > 0 && g->w_r[0] == 0;
    for (int64_t r = 0; in_place && r < g->nred; r++)
        in_place = g->w_r[r] == r * row;
    for (int64_t f = 0; in_place && f < g->nf; f++)  /* each block's channels consecutive */
        in_place = g->w_f[f] == g->w_f[f - f % POLYC_FBLOCK] + f % POLYC_FBLOCK;
    g->w_step = in_place ? row : POLYC_FBLOCK;
    const double weights = (double)g->nred * (double)g->nf, image = (double)g->image_elements;
    /* FLOPs of a channel vector x tile: RQ points, nred steps, an FMA of LANES lanes each. */
    const double flops = 2.0 * POLYC_NR * POLYC_LANES * (double)polyc_max(1, g->nred);
    const double flops_per_byte = FLOPS_PER_BYTE;
    const int64_t wanted = 4 * (int64_t)nthr;
    int64_t best_chunks = 1, best_runs = 1, best_items = 0;
    double least_cost = -1, least_traffic = -1;
    /* Three passes over the splits: the least cost; the least traffic among those within 2% of
       it (the cost is a rough estimate); the most items near both. */
    for (int pass = 0; pass < 3; pass++) {
        for (int64_t chunks = 1; chunks <= g->nfb; chunks++) {
            const int64_t size = (g->nfb + chunks - 1) / chunks;
            if (chunks > 1 && (g->nfb + size - 1) / size != chunks)
                continue;  /* the same chunks as a smaller count */
            const int64_t per = g->nitems * chunks;
            for (int64_t items = nthr, last_runs = 0; items <= wanted; items += nthr) {
                const int64_t runs = polyc_max(1, polyc_min(g->ntiles, (items + per - 1) / per));
                if (runs == last_runs)
                    continue;  /* the same split as the count before */
                last_runs = runs;
                /* A chunk's weights that fit in L2 stay there between a thread's runs. */
                const int fits = (double)size * POLYC_FBLOCK * (double)g->nred * sizeof(T) <= 2.0 * WEIGHT_SLICE;
                const double reads = fits ? (double)polyc_min(runs, nthr) : (double)runs;
                const double traffic = (reads * weights + (double)chunks * image) * sizeof(T);
                const double busiest = nthr > 1 ? polyc_conv_busiest(g, size, runs, nthr) * flops : 0;
                const double cost = busiest > flops_per_byte * traffic ? busiest : flops_per_byte * traffic;
                const int64_t count = polyc_min(per * runs, wanted);
                if (pass == 0) {
                    if (least_cost < 0 || cost < least_cost)
                        least_cost = cost;
                } else if (cost <= 1.02 * least_cost) {
                    if (pass == 1 && (least_traffic < 0 || traffic < least_traffic))
                        least_traffic = traffic;
                    if (pass == 2 && traffic <= 1.05 * least_traffic && count > best_items) {
                        best_chunks = chunks;
                        best_runs = runs;
                        best_items = count;
                    }
                }
            }
        }
    }
    int64_t take = CHUNK_BLOCKS;
    if (take <= 0)
        take = (g->ntiles + best_runs - 1) / best_runs;
    g->take_size = polyc_max(1, take);
    g->takes = (g->ntiles + g->take_size - 1) / g->take_size;
    g->fchunk_size = (g->nfb + best_chunks - 1) / best_chunks;
    g->fchunks = (g->nfb + g->fchunk_size - 1) / g->fchunk_size;
    g->rchunk = polyc_max(1, WEIGHT_SLICE / ((int64_t)sizeof(T) * POLYC_FBLOCK * g->fchunk_size));
    g->nwork = g->nitems * g->fchunks * g->takes;
    /* An output larger than the last-level cache is written with streaming stores, which go to
       memory without reading its lines first (a third of the traffic of a layer that expands few
       channels into many: mobilenet_v2's 16 -> 96 layer at 112 x 112 writes 38.5 MB at batch 8),
       when its tiles are stored once: the reduction in one chunk, the epilogue in registers. */
    g->stream_out = (!POLYC_HAS_EPILOGUE || POLYC_REGISTER_EPILOGUE) && g->rchunk >= g->nred
        && (double)g->nitems * (double)g->nout * (double)g->nf * sizeof(T) > (double)STREAM_BYTES;
    return in_place;
}
