/* syr2k: symmetric rank-2k update of the lower triangle, C = alpha (A B^T + B A^T) + beta C
 * (C is N x N, A and B are N x M). */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(40, 800)
#endif
#ifndef M
#define M AFFINE_PICK(32, 700)
#endif

AFFINE_NOINLINE void kernel_syr2k(int n, int m, double alpha, double beta,
                                  double C[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                  const double A[restrict AFFINE_N(n, N)][AFFINE_N(m, M)],
                                  const double B[restrict AFFINE_N(n, N)][AFFINE_N(m, M)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++) {
    for (int j = 0; j <= i; j++)
      C[i][j] *= beta;
    for (int k = 0; k < AFFINE_N(m, M); k++)
      for (int j = 0; j <= i; j++)
        C[i][j] += A[j][k] * alpha * B[i][k] + B[j][k] * alpha * A[i][k];
  }
}

int main(int argc, char **argv) {
  double(*C)[N] = affine_alloc(sizeof(double[N][N]));
  double(*A)[M] = affine_alloc(sizeof(double[N][M]));
  double(*B)[M] = affine_alloc(sizeof(double[N][M]));
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < M; k++) {
      A[i][k] = affine_value(1, i, k, 0);
      B[i][k] = affine_value(2, i, k, 0);
    }
    for (int j = 0; j < N; j++) C[i][j] = affine_value(3, i, j, 0);
  }
  const int n = affine_size(N), m = affine_size(M);
  double seconds;
  AFFINE_TIME(seconds, kernel_syr2k(n, m, 1.5, 1.2, C, A, B));
  affine_finish(argc, argv, seconds, (const double *)C, (size_t)N * N, (const double *)0);
  return 0;
}
