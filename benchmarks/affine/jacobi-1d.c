/* jacobi-1d: TSTEPS Jacobi sweeps of the 3-point average on N points, ping-ponging between A
 * and B (end points fixed). */
#include "affine.h"

#ifndef TSTEPS
#define TSTEPS AFFINE_PICK(10, 10000)
#endif
#ifndef N
#define N AFFINE_PICK(64, 40000)
#endif

AFFINE_NOINLINE void kernel_jacobi_1d(int tsteps, int n, double A[restrict AFFINE_N(n, N)],
                                      double B[restrict AFFINE_N(n, N)]) {
  for (int t = 0; t < AFFINE_N(tsteps, TSTEPS); t++) {
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++)
      B[i] = (A[i - 1] + A[i] + A[i + 1]) / 3.0;
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++)
      A[i] = (B[i - 1] + B[i] + B[i + 1]) / 3.0;
  }
}

int main(int argc, char **argv) {
  double *A = affine_alloc(sizeof(double[N])), *B = affine_alloc(sizeof(double[N]));
  for (int i = 0; i < N; i++) {
    A[i] = affine_value(1, i, 0, 0);
    B[i] = A[i];
  }
  const int tsteps = affine_size(TSTEPS), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_jacobi_1d(tsteps, n, A, B));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)N, (const double *)B, (size_t)N, (const double *)0);
  return 0;
}
