/* lu: in-place LU decomposition without pivoting (Doolittle, row by row): A = L * U with L
 * unit lower triangular (below the diagonal) and U upper triangular (on and above it):
 *   for j < i:  A[i][j] = (A[i][j] - sum_{k<j} A[i][k] * A[k][j]) / A[j][j]
 *   for j >= i: A[i][j] =  A[i][j] - sum_{k<i} A[i][k] * A[k][j]
 * The input is diagonally dominant, so no pivoting is needed. */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(48, 1200)
#endif

AFFINE_NOINLINE void kernel_lu(int n, double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++) {
    for (int j = 0; j < i; j++) {
      for (int k = 0; k < j; k++)
        A[i][j] -= A[i][k] * A[k][j];
      A[i][j] /= A[j][j];
    }
    for (int j = i; j < AFFINE_N(n, N); j++)
      for (int k = 0; k < i; k++)
        A[i][j] -= A[i][k] * A[k][j];
  }
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[N][N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) A[i][j] = affine_value(1, i, j, 0) + (i == j ? (double)N : 0.0);
  const int n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_lu(n, A));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)N * N, (const double *)0);
  return 0;
}
