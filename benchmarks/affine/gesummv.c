/* gesummv: y = alpha A x + beta B x (two matrix-vector products summed), through t = A x. */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(40, 4000)
#endif

AFFINE_NOINLINE void kernel_gesummv(int n, double alpha, double beta,
                                    const double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                    const double B[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                    double t[restrict AFFINE_N(n, N)], const double x[restrict AFFINE_N(n, N)],
                                    double y[restrict AFFINE_N(n, N)]) {
  for (int i = 0; i < AFFINE_N(n, N); i++) {
    t[i] = 0.0;
    y[i] = 0.0;
    for (int j = 0; j < AFFINE_N(n, N); j++) {
      t[i] += A[i][j] * x[j];
      y[i] += B[i][j] * x[j];
    }
    y[i] = alpha * t[i] + beta * y[i];
  }
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[N][N]));
  double(*B)[N] = affine_alloc(sizeof(double[N][N]));
  double *t = affine_alloc(sizeof(double[N])), *x = affine_alloc(sizeof(double[N])), *y = affine_alloc(sizeof(double[N]));
  for (int i = 0; i < N; i++) {
    x[i] = affine_value(1, i, 0, 0);
    for (int j = 0; j < N; j++) {
      A[i][j] = affine_value(2, i, j, 0);
      B[i][j] = affine_value(3, i, j, 0);
    }
  }
  const int n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_gesummv(n, 1.5, 1.2, A, B, t, x, y));
  affine_finish(argc, argv, seconds, (const double *)t, (size_t)N, (const double *)y, (size_t)N, (const double *)0);
  return 0;
}
