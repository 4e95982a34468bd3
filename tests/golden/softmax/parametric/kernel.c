/*
 * polyc kernel for def 'softmax'
 * sizes: parametric
 * options: fusion=smart tile_sizes=None parallel=True vectorize=True unroll=1 specialize=False
 *   S0: M(n) max=! X(n, r_d)
 *   S1: O(n, d) = exp(X(n, d) - M(n))
 *   S2: S(n) +=! O(n, r_d)
 *   S3: O(n, d) = O(n, d) / S(n)
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

int polyc_softmax(const float *__restrict__ X, float *__restrict__ O, float *__restrict__ M, float *__restrict__ S, int64_t N, int64_t D)
{
  const int64_t X_extent0 = N;
  const int64_t X_extent1 = D;
  const int64_t O_extent0 = N;
  const int64_t O_extent1 = D;
  const int64_t M_extent0 = N;
  const int64_t S_extent0 = N;
  int polyc_status = 0;
  (void)polyc_status;
  #pragma omp parallel for
  for (int64_t c0 = INT64_C(0); c0 < N; c0 += INT64_C(1))
  {
    M[(c0)] = (-INFINITY);
    if ((INT64_C(0)) < D)
    {
      float polyc_acc_M = -INFINITY;
      #pragma omp simd reduction(max:polyc_acc_M)
      for (int64_t c1 = INT64_C(0); c1 < D; c1 += INT64_C(1))
        polyc_acc_M = polyc_lane_maxf(polyc_acc_M, (X[((c0) * X_extent1 + (c1))]));
      M[(c0)] = (float)polyc_fmaxf(M[(c0)], polyc_acc_M);
    }
    if ((INT64_C(0)) < D)
    {
      const float polyc_invariant_0 = M[(c0)];
      #pragma omp simd
      for (int64_t c1 = INT64_C(0); c1 < D; c1 += INT64_C(1))
        O[((c0) * O_extent1 + (c1))] = polyc_expf(((X[((c0) * X_extent1 + (c1))]) - (polyc_invariant_0)));
    }
    S[(c0)] = (-0.0f);
    if ((INT64_C(0)) < D)
    {
      float polyc_acc_S_total = S[(c0)];
      for (int64_t c1_block = INT64_C(0); c1_block <= D - 1; c1_block += 256)
      {
        const int64_t c1_last = polyc_min(c1_block + 255, D - 1);
        float polyc_acc_S = (-0.0f);
        #pragma omp simd reduction(polyc_sum_float32:polyc_acc_S)
        for (int64_t c1 = c1_block; c1 <= c1_last; c1 += 1)
          polyc_acc_S = (float)(polyc_acc_S + (O[((c0) * O_extent1 + (c1))]));
        polyc_acc_S_total = (float)(polyc_acc_S_total + polyc_acc_S);
      }
      S[(c0)] = polyc_acc_S_total;
    }
    if ((INT64_C(0)) < D)
    {
      const float polyc_invariant_0 = S[(c0)];
      #pragma omp simd
      for (int64_t c1 = INT64_C(0); c1 < D; c1 += INT64_C(1))
        O[((c0) * O_extent1 + (c1))] = ((O[((c0) * O_extent1 + (c1))]) / (polyc_invariant_0));
    }
  }
  return polyc_status;
}
