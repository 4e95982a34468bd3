"""TC sources the visualisation tests share."""

MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
# C(i) reads B(i + 1): fusing the two statements needs a shift.
SHIFTED = """def shifted(float(N) A) -> (C) {
    B(i) = A(i) * 2 where i in 0:N
    C(i) = B(i + 1) + B(i) where i in 0:N-1
}"""
