/*
 * polyc kernel for def 'mlp'
 * sizes: parametric
 * options: fusion=smart tile_sizes=None parallel=True vectorize=True unroll=1 specialize=False
 *   S0: O(i, j) +=! I(i, r_k) * W(r_k, j)
 *   S1: O(i, j) = fmax(O(i, j) + b(j), 0)
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

int polyc_mlp(const float *__restrict__ I, const float *__restrict__ W, const float *__restrict__ b, float *__restrict__ O, int64_t M, int64_t K, int64_t N)
{
  const int64_t I_extent0 = M;
  const int64_t I_extent1 = K;
  const int64_t W_extent0 = K;
  const int64_t W_extent1 = N;
  const int64_t b_extent0 = N;
  const int64_t O_extent0 = M;
  const int64_t O_extent1 = N;
  int polyc_status = 0;
  (void)polyc_status;
  #pragma omp parallel for
  for (int64_t c0 = INT64_C(0); c0 < M; c0 += INT64_C(128))
    for (int64_t c1 = INT64_C(0); c1 < N; c1 += INT64_C(128))
      for (int64_t c2 = INT64_C(0); c2 <= polyc_min(INT64_C(127), ((M - c0) - INT64_C(1))); c2 += INT64_C(1))
        for (int64_t c3 = INT64_C(0); c3 <= polyc_min(INT64_C(127), ((N - c1) - INT64_C(1))); c3 += INT64_C(1))
        {
          O[(((c0 + c2)) * O_extent1 + ((c1 + c3)))] = (-0.0f);
          {
            for (int64_t c4 = INT64_C(0); c4 < K; c4 += INT64_C(1))
              O[(((c0 + c2)) * O_extent1 + ((c1 + c3)))] = (float)(O[(((c0 + c2)) * O_extent1 + ((c1 + c3)))] + ((I[(((((c0 + c2)))) * I_extent1 + (c4))]) * (W[((c4) * W_extent1 + ((((c1 + c3)))))])));
            O[(((c0 + c2)) * O_extent1 + ((c1 + c3)))] = polyc_fmaxf(((O[(((((c0 + c2)))) * O_extent1 + ((((c1 + c3)))))]) + (b[((((c1 + c3))))])), 0.0f);
          }
        }
  return polyc_status;
}
