/* symm: C = alpha A B + beta C with A (M x M) symmetric, stored in its lower triangle only:
 * A_sym[i][k] is A[i][k] for k <= i and A[k][i] for k > i.  B and C are M x N. */
#include "affine.h"

#ifndef M
#define M AFFINE_PICK(36, 1000)
#endif
#ifndef N
#define N AFFINE_PICK(44, 1200)
#endif

AFFINE_NOINLINE void kernel_symm(int m, int n, double alpha, double beta,
                                 double C[restrict AFFINE_N(m, M)][AFFINE_N(n, N)],
                                 const double A[restrict AFFINE_N(m, M)][AFFINE_N(m, M)],
                                 const double B[restrict AFFINE_N(m, M)][AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(m, M); i++) {
    for (int j = 0; j < AFFINE_N(n, N); j++)
      C[i][j] *= beta;
    for (int k = 0; k <= i; k++)
      for (int j = 0; j < AFFINE_N(n, N); j++)
        C[i][j] += alpha * A[i][k] * B[k][j];
    for (int k = i + 1; k < AFFINE_N(m, M); k++)
      for (int j = 0; j < AFFINE_N(n, N); j++)
        C[i][j] += alpha * A[k][i] * B[k][j];
  }
}

int main(int argc, char **argv) {
  double(*C)[N] = affine_alloc(sizeof(double[M][N]));
  double(*A)[M] = affine_alloc(sizeof(double[M][M]));
  double(*B)[N] = affine_alloc(sizeof(double[M][N]));
  for (int i = 0; i < M; i++) {
    for (int k = 0; k < M; k++) A[i][k] = affine_value(1, i, k, 0);
    for (int j = 0; j < N; j++) {
      B[i][j] = affine_value(2, i, j, 0);
      C[i][j] = affine_value(3, i, j, 0);
    }
  }
  const int m = affine_size(M), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_symm(m, n, 1.5, 1.2, C, A, B));
  affine_finish(argc, argv, seconds, (const double *)C, (size_t)M * N, (const double *)0);
  return 0;
}
