/* gemver: a rank-2 update and two matrix-vector products (BLAS-2 "GEMVER"):
 *   A = A + u1 v1^T + u2 v2^T;  x = x + beta A^T y + z;  w = w + alpha A x. */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(40, 4000)
#endif

AFFINE_NOINLINE void kernel_gemver(int n, double alpha, double beta, double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                   const double u1[restrict AFFINE_N(n, N)], const double v1[restrict AFFINE_N(n, N)],
                                   const double u2[restrict AFFINE_N(n, N)], const double v2[restrict AFFINE_N(n, N)],
                                   double w[restrict AFFINE_N(n, N)], double x[restrict AFFINE_N(n, N)],
                                   const double y[restrict AFFINE_N(n, N)], const double z[restrict AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++)
    for (int j = 0; j < AFFINE_N(n, N); j++)
      A[i][j] = A[i][j] + u1[i] * v1[j] + u2[i] * v2[j];
  for (int i = 0; i < AFFINE_N(n, N); i++)
    for (int j = 0; j < AFFINE_N(n, N); j++)
      x[i] = x[i] + beta * A[j][i] * y[j];
  for (int i = 0; i < AFFINE_N(n, N); i++)
    x[i] = x[i] + z[i];
  for (int i = 0; i < AFFINE_N(n, N); i++)
    for (int j = 0; j < AFFINE_N(n, N); j++)
      w[i] = w[i] + alpha * A[i][j] * x[j];
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[N][N]));
  double *u1 = affine_alloc(sizeof(double[N])), *v1 = affine_alloc(sizeof(double[N]));
  double *u2 = affine_alloc(sizeof(double[N])), *v2 = affine_alloc(sizeof(double[N]));
  double *w = affine_alloc(sizeof(double[N])), *x = affine_alloc(sizeof(double[N]));
  double *y = affine_alloc(sizeof(double[N])), *z = affine_alloc(sizeof(double[N]));
  for (int i = 0; i < N; i++) {
    u1[i] = affine_value(1, i, 0, 0);
    v1[i] = affine_value(2, i, 0, 0);
    u2[i] = affine_value(3, i, 0, 0);
    v2[i] = affine_value(4, i, 0, 0);
    y[i] = affine_value(5, i, 0, 0);
    z[i] = affine_value(6, i, 0, 0);
    for (int j = 0; j < N; j++) A[i][j] = affine_value(7, i, j, 0);
  }
  const int n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_gemver(n, 1.5, 1.2, A, u1, v1, u2, v2, w, x, y, z));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)N * N, (const double *)x, (size_t)N,
                (const double *)w, (size_t)N, (const double *)0);
  return 0;
}
