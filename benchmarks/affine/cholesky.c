/* cholesky: in-place Cholesky factorization A = L L^T of a symmetric positive definite matrix,
 * L in the lower triangle (row by row):
 *   for j < i: L[i][j] = (A[i][j] - sum_{k<j} L[i][k] L[j][k]) / L[j][j]
 *   L[i][i] = sqrt(A[i][i] - sum_{k<i} L[i][k]^2)
 * The input is symmetric and diagonally dominant with a positive diagonal (so it is SPD). */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(48, 1200)
#endif

AFFINE_NOINLINE void kernel_cholesky(int n, double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++) {
    for (int j = 0; j < i; j++) {
      for (int k = 0; k < j; k++)
        A[i][j] -= A[i][k] * A[j][k];
      A[i][j] /= A[j][j];
    }
    for (int k = 0; k < i; k++)
      A[i][i] -= A[i][k] * A[i][k];
    A[i][i] = sqrt(A[i][i]);
  }
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[N][N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j <= i; j++) {
      A[i][j] = affine_value(1, i, j, 0) + (i == j ? (double)N : 0.0);
      A[j][i] = A[i][j];
    }
  const int n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_cholesky(n, A));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)N * N, (const double *)0);
  return 0;
}
