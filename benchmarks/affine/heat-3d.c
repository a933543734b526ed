/* heat-3d: TSTEPS explicit steps of the 3-D heat equation (7-point stencil, diffusion number
 * 0.125 per axis) on an N^3 grid, ping-ponging between A and B (boundary fixed). */
#include "affine.h"

#ifndef TSTEPS
#define TSTEPS AFFINE_PICK(4, 100)
#endif
#ifndef N
#define N AFFINE_PICK(16, 120)
#endif

AFFINE_NOINLINE void kernel_heat_3d(int tsteps, int n,
                                    double A[restrict AFFINE_N(n, N)][AFFINE_N(n, N)][AFFINE_N(n, N)],
                                    double B[restrict AFFINE_N(n, N)][AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  for (int t = 0; t < AFFINE_N(tsteps, TSTEPS); t++) {
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++)
      for (int j = 1; j < AFFINE_N(n, N) - 1; j++)
        for (int k = 1; k < AFFINE_N(n, N) - 1; k++)
          B[i][j][k] = A[i][j][k] + 0.125 * (A[i + 1][j][k] - 2.0 * A[i][j][k] + A[i - 1][j][k]) +
                       0.125 * (A[i][j + 1][k] - 2.0 * A[i][j][k] + A[i][j - 1][k]) +
                       0.125 * (A[i][j][k + 1] - 2.0 * A[i][j][k] + A[i][j][k - 1]);
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++)
      for (int j = 1; j < AFFINE_N(n, N) - 1; j++)
        for (int k = 1; k < AFFINE_N(n, N) - 1; k++)
          A[i][j][k] = B[i][j][k] + 0.125 * (B[i + 1][j][k] - 2.0 * B[i][j][k] + B[i - 1][j][k]) +
                       0.125 * (B[i][j + 1][k] - 2.0 * B[i][j][k] + B[i][j - 1][k]) +
                       0.125 * (B[i][j][k + 1] - 2.0 * B[i][j][k] + B[i][j][k - 1]);
  }
}

int main(int argc, char **argv) {
  double(*A)[N][N] = affine_alloc(sizeof(double[N][N][N]));
  double(*B)[N][N] = affine_alloc(sizeof(double[N][N][N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < N; k++) {
        A[i][j][k] = affine_value(1, i, j, k);
        B[i][j][k] = A[i][j][k];
      }
  const int tsteps = affine_size(TSTEPS), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_heat_3d(tsteps, n, A, B));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)N * N * N, (const double *)B, (size_t)N * N * N,
                (const double *)0);
  return 0;
}
