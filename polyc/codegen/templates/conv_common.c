
/* A point's sort key (its order: by key, then by index). */
typedef struct { uint64_t key; int64_t index; } polyc_sort_t;

static __attribute__((unused)) int polyc_sort_compare(const void *a, const void *b)
{
    const polyc_sort_t *x = (const polyc_sort_t *)a, *y = (const polyc_sort_t *)b;
    return x->key != y->key ? (x->key < y->key ? -1 : 1) : (x->index > y->index) - (x->index < y->index);
}

/* table[i] = its old table[order[i].index] (old: scratch of n entries). */
static __attribute__((unused)) void polyc_permute(int64_t *table, int64_t *old, const polyc_sort_t *order, int64_t n)
{
    memcpy(old, table, sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        table[i] = old[order[i].index];
}

/* Whether offsets[i] == offsets[0] + i for every i < count. */
static int polyc_steps_by_one(const int64_t *offsets, int64_t count)
{
    for (int64_t i = 1; i < count; i++)
        if (offsets[i] != offsets[0] + i) return 0;
    return 1;
}

/* The lowest min(max(n, 0), lanes) bits set. */
static inline uint32_t polyc_lane_mask(int64_t n, int lanes)
{
    return n >= lanes ? (uint32_t)((1ull << lanes) - 1) : n <= 0 ? 0u : (uint32_t)((1u << n) - 1);
}
