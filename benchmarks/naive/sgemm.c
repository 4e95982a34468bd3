/* sgemm: C(m, n) = sum_k A(m, k) * B(k, n).  Loop order i-k-j as in PolyBench's gemm. */
void kernel(const float A[restrict M][K], const float B[restrict K][N], float C[restrict M][N])
{
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++)
            C[m][n] = 0.0f;
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                C[m][n] += A[m][k] * B[k][n];
    }
}
