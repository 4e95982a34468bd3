
/* Rows row0 <= row < row1 of the image's zero-padded copy `pad` (a row: its innermost
   dimension; element p is the image at pad_base + p inside [pad_lo, pad_hi), else zero). */
static void polyc_conv_pad_rows(const polyc_conv_t *restrict g, T *restrict pad, int64_t row0, int64_t row1)
{
    const int last = POLYC_IMAGE_RANK - 1;
    const int64_t inner = g->pad_shape[last];
    const int64_t a = polyc_max(0, polyc_min(inner, g->pad_lo[last]));
    const int64_t b = polyc_max(a, polyc_min(inner, g->pad_hi[last]));
    for (int64_t row = row0; row < row1; row++) {
        int64_t rest = row, from = g->pad_base[last] + a;  /* the image's innermost stride is 1 */
        int inside = a < b;
        for (int d = last - 1; d >= 0; d--) {
            const int64_t p = rest % g->pad_shape[d];
            rest /= g->pad_shape[d];
            inside &= p >= g->pad_lo[d] && p < g->pad_hi[d];
            from += (g->pad_base[d] + p) * g->image_stride[d];
        }
        T *restrict to = pad + row * inner;
        if (!inside) {
            memset(to, 0, sizeof(T) * (size_t)inner);
            continue;
        }
        memset(to, 0, sizeof(T) * (size_t)a);
        memcpy(to + a, g->image + from, sizeof(T) * (size_t)(b - a));
        memset(to + b, 0, sizeof(T) * (size_t)(inner - b));
    }
}

#if !defined(POLYC_STREAM_FENCE)
#define POLYC_STREAM_FENCE() ((void)0)
#endif

/* Pads the image (when there is padding), packs the weights, then does every work item; 0,
   or STATUS when memory is short. */
static int polyc_conv_run(polyc_conv_t *restrict g, const T *restrict w, int init)
{
    const int64_t nred = g->nred, ngroups = g->ngroups;
    const int64_t *restrict w_g = g->w_g, *restrict w_f = g->w_f, *restrict w_r = g->w_r;
    int nthr = 1, most = 1;
#if defined(_OPENMP)
    if ((double)g->nitems * (double)g->npoints * (double)g->nf * (double)(nred > 0 ? nred : 1) >= THRESHOLD) {
        most = polyc_most_threads();
        nthr = polyc_threads(most);
    }
#endif
    (void)most;
    g->w = w;
    const int in_place = polyc_conv_plan(g, nthr);
    g->wg_stride = g->nfb * nred * POLYC_FBLOCK;
    /* Packed weights and each thread's input panel, in the kernel's kept workspace. */
    const int64_t line = 64 / (int64_t)sizeof(T);  /* the panels start on a cache line */
    const int64_t wpack_elements = in_place ? 0 : (ngroups * g->wg_stride + line - 1) / line * line;
    const int64_t panel_elements = POLYC_PANELS && !g->direct ? (int64_t)nthr * nred * POLYC_NR : 0;
    const int64_t pad_elements = (g->pad_elements + line - 1) / line * line;
    polyc_workspace_t *workspace = polyc_workspace_take(
        (size_t)(wpack_elements + panel_elements + pad_elements) * sizeof(T));
    if (workspace == NULL)
        return STATUS;
    T *panels = panel_elements ? (T *)workspace->memory + wpack_elements : NULL;
    T *padded = pad_elements ? (T *)workspace->memory + wpack_elements + panel_elements : NULL;
    const int64_t pad_rows = padded ? g->pad_elements / g->pad_shape[POLYC_IMAGE_RANK - 1] : 0;
    if (padded)
        g->in = padded;
    g->wpack = in_place ? NULL : (T *)workspace->memory;
    const int64_t npack = in_place ? 0 : ngroups * g->nfb, total = g->nwork;
    if (nthr <= 1) {
        polyc_conv_pad_rows(g, padded, 0, pad_rows);
        for (int64_t x = 0; x < npack; x++)
            polyc_conv_pack(g, w, w_g, w_f, w_r, x);
        for (int64_t x = 0; x < total; x++)
            polyc_conv_work(g, x, panels, init);
        POLYC_STREAM_FENCE();
    }
#if defined(_OPENMP)
    else {
        int slow = 0;
        const int64_t run = polyc_max(1, polyc_min(4, total / (8 * (int64_t)nthr)));
        const double call_start = polyc_call_start();
        #pragma omp parallel num_threads(nthr)
        {
            polyc_thread_clock_t clock;
            polyc_thread_start(&clock, call_start);
            T *panel = panels == NULL ? NULL : panels + (int64_t)omp_get_thread_num() * nred * POLYC_NR;
            #pragma omp for schedule(static)
            for (int64_t x = 0; x < pad_rows; x++)
                polyc_conv_pad_rows(g, padded, x, x + 1);
            /* The threads pack the weights together (for 256 x 256 x 3 x 3 filters a large
               share of the call on one thread: resnet18's, python -m
               benchmarks.onnx_segments resnet18), then wait for one another. */
            #pragma omp for schedule(static)
            for (int64_t x = 0; x < npack; x++)
                polyc_conv_pack(g, w, w_g, w_f, w_r, x);
            /* Runs of consecutive work items, at least 8 per thread (taken as threads come
               free): with one tile per take the threads alternated tiles, whose outputs share
               a cache line at each end in every channel plane (mobilenet_v2's 1x1 16 -> 96
               convolution at 112 x 112 ran faster in runs: python -m benchmarks.onnx_segments
               mobilenet_v2); at most 4 items a run, so that the last runs still balance. */
            #pragma omp for schedule(dynamic, run) nowait
            for (int64_t x = 0; x < total; x++)
                polyc_conv_work(g, x, panel, init);
            POLYC_STREAM_FENCE();  /* this thread's streaming stores reach memory before the call returns */
            polyc_thread_stop(&clock, &slow);
        }
        polyc_threads_after(nthr, most, slow);
    }
#endif
    polyc_workspace_give_back(workspace);
    return 0;
}
