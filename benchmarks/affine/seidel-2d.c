/* seidel-2d: TSTEPS Gauss-Seidel sweeps of the 9-point average on an N x N grid, in place
 * (each point sees the new values above and to its left, boundary fixed). */
#include "affine.h"

#ifndef TSTEPS
#define TSTEPS AFFINE_PICK(4, 40)
#endif
#ifndef N
#define N AFFINE_PICK(40, 1500)
#endif

AFFINE_NOINLINE void kernel_seidel_2d(int tsteps, int n, double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  for (int t = 0; t < AFFINE_N(tsteps, TSTEPS); t++)
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++)
      for (int j = 1; j < AFFINE_N(n, N) - 1; j++)
        A[i][j] = (A[i - 1][j - 1] + A[i - 1][j] + A[i - 1][j + 1] + A[i][j - 1] + A[i][j] + A[i][j + 1] +
                   A[i + 1][j - 1] + A[i + 1][j] + A[i + 1][j + 1]) / 9.0;
}

int main(int argc, char **argv) {
  double(*A)[N] = affine_alloc(sizeof(double[N][N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) A[i][j] = affine_value(1, i, j, 0);
  const int tsteps = affine_size(TSTEPS), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_seidel_2d(tsteps, n, A));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)N * N, (const double *)0);
  return 0;
}
