/* jacobi-2d: TSTEPS Jacobi sweeps of the 5-point average on an N x N grid, ping-ponging
 * between A and B (boundary rows and columns fixed). */
#include "affine.h"

#ifndef TSTEPS
#define TSTEPS AFFINE_PICK(6, 500)
#endif
#ifndef N
#define N AFFINE_PICK(40, 1300)
#endif

AFFINE_NOINLINE void kernel_jacobi_2d(int tsteps, int n, double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                      double B[restrict AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  for (int t = 0; t < AFFINE_N(tsteps, TSTEPS); t++) {
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++)
      for (int j = 1; j < AFFINE_N(n, N) - 1; j++)
        B[i][j] = 0.2 * (A[i][j] + A[i - 1][j] + A[i + 1][j] + A[i][j - 1] + A[i][j + 1]);
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++)
      for (int j = 1; j < AFFINE_N(n, N) - 1; j++)
        A[i][j] = 0.2 * (B[i][j] + B[i - 1][j] + B[i + 1][j] + B[i][j - 1] + B[i][j + 1]);
  }
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[N][N]));
  double(*B)[N] = affine_alloc(sizeof(double[N][N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      A[i][j] = affine_value(1, i, j, 0);
      B[i][j] = A[i][j];
    }
  const int tsteps = affine_size(TSTEPS), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_jacobi_2d(tsteps, n, A, B));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)N * N, (const double *)B, (size_t)N * N,
                (const double *)0);
  return 0;
}
