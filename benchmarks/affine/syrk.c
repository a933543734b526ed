/* syrk: symmetric rank-k update of the lower triangle, C = alpha A A^T + beta C (C is N x N,
 * A is N x M; only C[i][j] with j <= i is read or written). */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(40, 1200)
#endif
#ifndef M
#define M AFFINE_PICK(32, 1000)
#endif

AFFINE_NOINLINE void kernel_syrk(int n, int m, double alpha, double beta,
                                 double C[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                 const double A[restrict AFFINE_N(n, N)][AFFINE_N(m, M)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++) {
    for (int j = 0; j <= i; j++)
      C[i][j] *= beta;
    for (int k = 0; k < AFFINE_N(m, M); k++)
      for (int j = 0; j <= i; j++)
        C[i][j] += alpha * A[i][k] * A[j][k];
  }
}

int main(int argc, char **argv) {
  double(*C)[N] = affine_alloc(sizeof(double[N][N]));
  double(*A)[M] = affine_alloc(sizeof(double[N][M]));
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < M; k++) A[i][k] = affine_value(1, i, k, 0);
    for (int j = 0; j < N; j++) C[i][j] = affine_value(2, i, j, 0);
  }
  const int n = affine_size(N), m = affine_size(M);
  double seconds;
  AFFINE_TIME(seconds, kernel_syrk(n, m, 1.5, 1.2, C, A));
  affine_finish(argc, argv, seconds, (const double *)C, (size_t)N * N, (const double *)0);
  return 0;
}
