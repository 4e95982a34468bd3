/*
 * polyc kernel for def 'matmul'
 * sizes: parametric
 * options: fusion=smart tile_sizes=None parallel=True vectorize=True unroll=1 specialize=False
 *   S0: C(m, n) +=! A(m, r_k) * B(r_k, n)
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

int polyc_matmul(const float *__restrict__ A, const float *__restrict__ B, float *__restrict__ C, int64_t M, int64_t K, int64_t N)
{
  const int64_t A_extent0 = M;
  const int64_t A_extent1 = K;
  const int64_t B_extent0 = K;
  const int64_t B_extent1 = N;
  const int64_t C_extent0 = M;
  const int64_t C_extent1 = N;
  int polyc_status = 0;
  (void)polyc_status;
  #pragma omp parallel for
  for (int64_t c0 = INT64_C(0); c0 < M; c0 += INT64_C(128))
    for (int64_t c1 = INT64_C(0); c1 < N; c1 += INT64_C(128))
    {
      for (int64_t c3 = INT64_C(0); c3 <= polyc_min(INT64_C(127), ((M - c0) - INT64_C(1))); c3 += INT64_C(1))
      {
        for (int64_t c4 = INT64_C(0); c4 <= polyc_min(INT64_C(127), (K - INT64_C(1))); c4 += INT64_C(1))
          if ((INT64_C(0)) <= polyc_min(INT64_C(127), ((N - c1) - INT64_C(1))))
          {
            const float polyc_invariant_0 = A[(((((c0 + c3)))) * A_extent1 + (c4))];
            #pragma omp simd
            for (int64_t c5 = INT64_C(0); c5 <= polyc_min(INT64_C(127), ((N - c1) - INT64_C(1))); c5 += INT64_C(1))
            {
              if ((c4 == INT64_C(0)))
                C[(((c0 + c3)) * C_extent1 + ((c1 + c5)))] = (-0.0f);
              C[(((c0 + c3)) * C_extent1 + ((c1 + c5)))] = (float)(C[(((c0 + c3)) * C_extent1 + ((c1 + c5)))] + ((polyc_invariant_0) * (B[((c4) * B_extent1 + ((((c1 + c5)))))])));
            }
          }
        if ((K == INT64_C(0)))
        #pragma omp simd
        for (int64_t c5 = INT64_C(0); c5 <= polyc_min(INT64_C(127), ((N - c1) - INT64_C(1))); c5 += INT64_C(1))
          C[(((c0 + c3)) * C_extent1 + ((c1 + c5)))] = (-0.0f);
      }
      for (int64_t c2 = INT64_C(128); c2 < K; c2 += INT64_C(128))
        for (int64_t c3 = INT64_C(0); c3 <= polyc_min(INT64_C(127), ((M - c0) - INT64_C(1))); c3 += INT64_C(1))
          for (int64_t c4 = INT64_C(0); c4 <= polyc_min(INT64_C(127), ((K - c2) - INT64_C(1))); c4 += INT64_C(1))
            if ((INT64_C(0)) <= polyc_min(INT64_C(127), ((N - c1) - INT64_C(1))))
            {
              const float polyc_invariant_0 = A[(((((c0 + c3)))) * A_extent1 + ((((c2 + c4)))))];
              #pragma omp simd
              for (int64_t c5 = INT64_C(0); c5 <= polyc_min(INT64_C(127), ((N - c1) - INT64_C(1))); c5 += INT64_C(1))
                C[(((c0 + c3)) * C_extent1 + ((c1 + c5)))] = (float)(C[(((c0 + c3)) * C_extent1 + ((c1 + c5)))] + ((polyc_invariant_0) * (B[(((((c2 + c4)))) * B_extent1 + ((((c1 + c5)))))])));
            }
    }
  return polyc_status;
}
