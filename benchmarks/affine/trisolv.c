/* trisolv: forward substitution, solve L x = b with L (N x N) lower triangular:
 *   x[i] = (b[i] - sum_{j<i} L[i][j] x[j]) / L[i][i]. */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(60, 5000)
#endif

AFFINE_NOINLINE void kernel_trisolv(int n, const double L[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                    double x[restrict AFFINE_N(n, N)], const double b[restrict AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++) {
    x[i] = b[i];
    for (int j = 0; j < i; j++)
      x[i] -= L[i][j] * x[j];
    x[i] = x[i] / L[i][i];
  }
}

int main(int argc, char **argv) {
  double(*L)[N] = affine_alloc(sizeof(double[N][N]));
  double *x = affine_alloc(sizeof(double[N])), *b = affine_alloc(sizeof(double[N]));
  for (int i = 0; i < N; i++) {
    b[i] = affine_value(1, i, 0, 0);
    for (int j = 0; j <= i; j++) L[i][j] = (affine_value(2, i, j, 0) + (i == j ? 1.0 : 0.0)) / (double)(i + 1);
  }
  const int n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_trisolv(n, L, x, b));
  affine_finish(argc, argv, seconds, (const double *)x, (size_t)N, (const double *)0);
  return 0;
}
