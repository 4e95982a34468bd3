/*
 * polyc kernel for def 'scale_shift'
 * sizes: parametric
 * options: fusion=smart tile_sizes=None parallel=True vectorize=True unroll=1 specialize=False
 *   S0: B(i, j) = A(i, j) * 2
 *   S1: C(i, j) = B(i, j) + 1
 */
/* (polyc prelude omitted: see polyc/codegen/c_expr.py) */

static inline int64_t polyc_checked_index(int64_t index, int64_t extent, int *status)
{
    if (index >= 0 && index < extent) return index;
    __atomic_store_n(status, 1, __ATOMIC_RELAXED);
    return 0;
}

/* A bool element read as the byte it is: gcc 12 vectorizes loops that load _Bool arrays badly
   or not at all (a select on a bool mask over float arrays ran an order of magnitude slower
   than through this, AVX-512 and AVX2 alike).  Bool arrays hold 0 or 1. */
static inline int polyc_bool_at(const _Bool *element)
{
    return *(const unsigned char *)element != 0;
}

int polyc_scale_shift(const float *__restrict__ A, float *__restrict__ C, float *__restrict__ B, int64_t M, int64_t N)
{
  const int64_t A_extent0 = M;
  const int64_t A_extent1 = N;
  const int64_t C_extent0 = M;
  const int64_t C_extent1 = N;
  const int64_t B_extent0 = M;
  const int64_t B_extent1 = N;
  int polyc_status = 0;
  (void)polyc_status;
  #pragma omp parallel for
  for (int64_t c0 = INT64_C(0); c0 < M; c0 += INT64_C(128))
    for (int64_t c1 = INT64_C(0); c1 < N; c1 += INT64_C(128))
      for (int64_t c2 = INT64_C(0); c2 <= polyc_min(INT64_C(127), ((M - c0) - INT64_C(1))); c2 += INT64_C(1))
      #pragma omp simd
      for (int64_t c3 = INT64_C(0); c3 <= polyc_min(INT64_C(127), ((N - c1) - INT64_C(1))); c3 += INT64_C(1))
      {
        B[(((c0 + c2)) * B_extent1 + ((c1 + c3)))] = ((A[(((((c0 + c2)))) * A_extent1 + ((((c1 + c3)))))]) * 2.0f);
        C[(((c0 + c2)) * C_extent1 + ((c1 + c3)))] = ((B[(((((c0 + c2)))) * B_extent1 + ((((c1 + c3)))))]) + 1.0f);
      }
  return polyc_status;
}
