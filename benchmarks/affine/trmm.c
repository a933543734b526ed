/* trmm: triangular matrix product in place, B = alpha A B with A (M x M) unit upper triangular
 * (its diagonal is taken as 1, below it is not read) and B (M x N).  Row i of the result needs
 * rows k > i of the old B, so the rows are updated top to bottom:
 *   B[i][j] = alpha (B[i][j] + sum_{k>i} A[i][k] B[k][j]). */
#include "affine.h"

#ifndef M
#define M AFFINE_PICK(36, 1000)
#endif
#ifndef N
#define N AFFINE_PICK(44, 1200)
#endif

AFFINE_NOINLINE void kernel_trmm(int m, int n, double alpha, const double A[restrict AFFINE_N(m, M)][AFFINE_N(m, M)],
                                 double B[restrict AFFINE_N(m, M)][AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(m, M); i++)
    for (int j = 0; j < AFFINE_N(n, N); j++) {
      for (int k = i + 1; k < AFFINE_N(m, M); k++)
        B[i][j] += A[i][k] * B[k][j];
      B[i][j] = alpha * B[i][j];
    }
}

int main(int argc, char **argv) {
  double(*A)[M] = affine_alloc(sizeof(double[M][M]));
  double(*B)[N] = affine_alloc(sizeof(double[M][N]));
  for (int i = 0; i < M; i++) {
    for (int k = 0; k < M; k++) A[i][k] = affine_value(1, i, k, 0);
    for (int j = 0; j < N; j++) B[i][j] = affine_value(2, i, j, 0);
  }
  const int m = affine_size(M), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_trmm(m, n, 1.5, A, B));
  affine_finish(argc, argv, seconds, (const double *)B, (size_t)M * N, (const double *)0);
  return 0;
}
