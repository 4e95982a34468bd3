#include <stdlib.h>
#define POLYC_WORKSPACE_UNUSED __attribute__((unused))  /* a kernel without packing calls none */
typedef struct { void *memory; size_t bytes; } polyc_workspace_t;
typedef struct { polyc_workspace_t *block; } polyc_kept_workspace_t;

/* The kept block (a function's static: linked segments each keep their own). */
static POLYC_WORKSPACE_UNUSED polyc_kept_workspace_t *polyc_kept_workspace(void)
{
    static polyc_kept_workspace_t kept;
    return &kept;
}

/* 64-byte aligned scratch memory of at least `bytes` bytes, or NULL when there is none. */
static POLYC_WORKSPACE_UNUSED polyc_workspace_t *polyc_workspace_take(size_t bytes)
{
    polyc_workspace_t *w = __atomic_exchange_n(&polyc_kept_workspace()->block, NULL, __ATOMIC_ACQUIRE);
    if (w != NULL && w->bytes >= bytes)
        return w;
    if (w != NULL) {
        free(w->memory);
        free(w);
    }
    w = (polyc_workspace_t *)malloc(sizeof *w);
    if (w == NULL)
        return NULL;
    w->bytes = bytes > 0 ? (bytes + 63) / 64 * 64 : 64;
    w->memory = aligned_alloc(64, w->bytes);
    if (w->memory == NULL) {
        free(w);
        return NULL;
    }
    return w;
}

/* Ends a call's use of `w` (NULL: nothing): kept for the next call, or freed. */
static POLYC_WORKSPACE_UNUSED void polyc_workspace_give_back(polyc_workspace_t *w)
{
    polyc_workspace_t *none = NULL;
    polyc_kept_workspace_t *kept = polyc_kept_workspace();
    if (w != NULL && !__atomic_compare_exchange_n(&kept->block, &none, w, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
        free(w->memory);
        free(w);
    }
}
