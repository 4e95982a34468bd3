/*
 * polyc kernel for def 'matmul'
 * sizes: M=64, K=64, N=64
 * options: fusion=smart tile_sizes=None parallel=True vectorize=True unroll=1 specialize=True
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

int polyc_matmul(const float *__restrict__ A, const float *__restrict__ B, float *__restrict__ C)
{
  const int64_t M = 64;
  const int64_t K = 64;
  const int64_t N = 64;
  const int64_t A_extent0 = M;
  const int64_t A_extent1 = K;
  const int64_t B_extent0 = K;
  const int64_t B_extent1 = N;
  const int64_t C_extent0 = M;
  const int64_t C_extent1 = N;
  int polyc_status = 0;
  (void)polyc_status;
  #pragma omp parallel for collapse(3)
  for (int64_t c0 = INT64_C(0); c0 <= INT64_C(63); c0 += INT64_C(32))
    for (int64_t c3 = INT64_C(0); c3 <= INT64_C(31); c3 += INT64_C(12))
      for (int64_t c4 = INT64_C(0); c4 <= INT64_C(63); c4 += INT64_C(32))
      {
        for (int64_t c5 = INT64_C(0); c5 <= polyc_min(INT64_C(11), ((-c3) + INT64_C(31))); c5 += INT64_C(1))
          for (int64_t c6 = INT64_C(0); c6 <= INT64_C(31); c6 += INT64_C(1))
            C[((((c0 + c3) + c5)) * C_extent1 + ((c4 + c6)))] = (-0.0f);
        if (11 <= ((-c3) + INT64_C(31)))
        {
          {
            float polyc_tile_C[12][32];
            for (int64_t polyc_tile_row = 0; polyc_tile_row <= 11; polyc_tile_row += 1)
            #pragma omp simd
            for (int64_t polyc_tile_column = 0; polyc_tile_column <= INT64_C(31); polyc_tile_column += 1)
              polyc_tile_C[polyc_tile_row][polyc_tile_column] = C[((((c0 + c3) + polyc_tile_row)) * C_extent1 + ((c4 + polyc_tile_column)))];
            for (int64_t c5 = INT64_C(0); c5 <= INT64_C(63); c5 += INT64_C(1))
            #pragma GCC unroll 12
            for (int64_t c6 = INT64_C(0); c6 <= 11; c6 += INT64_C(1))
            {
              const float polyc_invariant_0 = A[((((((c0 + c3) + c6)))) * A_extent1 + (c5))];
              #pragma omp simd
              for (int64_t c7 = INT64_C(0); c7 <= INT64_C(31); c7 += INT64_C(1))
                polyc_tile_C[c6][c7] = (float)(polyc_tile_C[c6][c7] + ((polyc_invariant_0) * (B[((c5) * B_extent1 + ((((c4 + c7)))))])));
            }
            for (int64_t polyc_tile_row = 0; polyc_tile_row <= 11; polyc_tile_row += 1)
            #pragma omp simd
            for (int64_t polyc_tile_column = 0; polyc_tile_column <= INT64_C(31); polyc_tile_column += 1)
              C[((((c0 + c3) + polyc_tile_row)) * C_extent1 + ((c4 + polyc_tile_column)))] = polyc_tile_C[polyc_tile_row][polyc_tile_column];
          }
        }
        else
        {
          /* polyc: the loops above, for !(11 <= ((-c3) + INT64_C(31))) */
          {
            float polyc_tile_C[12][32];
            for (int64_t polyc_tile_row = 0; polyc_tile_row <= polyc_min(INT64_C(11), ((-c3) + INT64_C(31))); polyc_tile_row += 1)
            #pragma omp simd
            for (int64_t polyc_tile_column = 0; polyc_tile_column <= INT64_C(31); polyc_tile_column += 1)
              polyc_tile_C[polyc_tile_row][polyc_tile_column] = C[((((c0 + c3) + polyc_tile_row)) * C_extent1 + ((c4 + polyc_tile_column)))];
            for (int64_t c5 = INT64_C(0); c5 <= INT64_C(63); c5 += INT64_C(1))
            #pragma GCC unroll 12
            for (int64_t c6 = INT64_C(0); c6 <= polyc_min(INT64_C(11), ((-c3) + INT64_C(31))); c6 += INT64_C(1))
            {
              const float polyc_invariant_0 = A[((((((c0 + c3) + c6)))) * A_extent1 + (c5))];
              #pragma omp simd
              for (int64_t c7 = INT64_C(0); c7 <= INT64_C(31); c7 += INT64_C(1))
                polyc_tile_C[c6][c7] = (float)(polyc_tile_C[c6][c7] + ((polyc_invariant_0) * (B[((c5) * B_extent1 + ((((c4 + c7)))))])));
            }
            for (int64_t polyc_tile_row = 0; polyc_tile_row <= polyc_min(INT64_C(11), ((-c3) + INT64_C(31))); polyc_tile_row += 1)
            #pragma omp simd
            for (int64_t polyc_tile_column = 0; polyc_tile_column <= INT64_C(31); polyc_tile_column += 1)
              C[((((c0 + c3) + polyc_tile_row)) * C_extent1 + ((c4 + polyc_tile_column)))] = polyc_tile_C[polyc_tile_row][polyc_tile_column];
          }
        }
      }
  return polyc_status;
}
