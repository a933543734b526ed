/* mvt: two matrix-vector products with one matrix, x1 += A y1 and x2 += A^T y2. */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(40, 5000)
#endif

AFFINE_NOINLINE void kernel_mvt(int n, double x1[restrict AFFINE_N(n, N)], double x2[restrict AFFINE_N(n, N)],
                                const double y1[restrict AFFINE_N(n, N)], const double y2[restrict AFFINE_N(n, N)],
                                const double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++)
    for (int j = 0; j < AFFINE_N(n, N); j++)
      x1[i] += A[i][j] * y1[j];
  for (int i = 0; i < AFFINE_N(n, N); i++)
    for (int j = 0; j < AFFINE_N(n, N); j++)
      x2[i] += A[j][i] * y2[j];
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[N][N]));
  double *x1 = affine_alloc(sizeof(double[N]));
  double *x2 = affine_alloc(sizeof(double[N]));
  double *y1 = affine_alloc(sizeof(double[N]));
  double *y2 = affine_alloc(sizeof(double[N]));
  for (int i = 0; i < N; i++) {
    x1[i] = affine_value(1, i, 0, 0);
    x2[i] = affine_value(2, i, 0, 0);
    y1[i] = affine_value(3, i, 0, 0);
    y2[i] = affine_value(4, i, 0, 0);
    for (int j = 0; j < N; j++) A[i][j] = affine_value(5, i, j, 0);
  }
  const int n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_mvt(n, x1, x2, y1, y2, A));
  affine_finish(argc, argv, seconds, (const double *)x1, (size_t)N, (const double *)x2, (size_t)N, (const double *)0);
  return 0;
}
