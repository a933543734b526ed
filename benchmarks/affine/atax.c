/* atax: y = A^T (A x), A is M x N, through t = A x (length M). */
#include "affine.h"

#ifndef M
#define M AFFINE_PICK(38, 4000)
#endif
#ifndef N
#define N AFFINE_PICK(42, 5000)
#endif

AFFINE_NOINLINE void kernel_atax(int m, int n, const double A[restrict AFFINE_N(m, M)][AFFINE_N(n, N)],
                                 const double x[restrict AFFINE_N(n, N)], double y[restrict AFFINE_N(n, N)],
                                 double t[restrict AFFINE_N(m, M)]) {
  for (int j = 0; j < AFFINE_N(n, N); j++)
    y[j] = 0.0;
  for (int i = 0; i < AFFINE_N(m, M); i++) {
    t[i] = 0.0;
    for (int j = 0; j < AFFINE_N(n, N); j++)
      t[i] += A[i][j] * x[j];
    for (int j = 0; j < AFFINE_N(n, N); j++)
      y[j] += A[i][j] * t[i];
  }
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[M][N]));
  double *x = affine_alloc(sizeof(double[N]));
  double *y = affine_alloc(sizeof(double[N]));
  double *t = affine_alloc(sizeof(double[M]));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) A[i][j] = affine_value(1, i, j, 0);
  for (int j = 0; j < N; j++) x[j] = affine_value(2, j, 0, 0);
  const int m = affine_size(M), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_atax(m, n, A, x, y, t));
  affine_finish(argc, argv, seconds, (const double *)y, (size_t)N, (const double *)t, (size_t)M, (const double *)0);
  return 0;
}
