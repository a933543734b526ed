/* gemm: C = alpha * A * B + beta * C, A is NI x NK, B is NK x NJ, C is NI x NJ. */
#include "affine.h"

#ifndef NI
#define NI AFFINE_PICK(40, 1000)
#endif
#ifndef NJ
#define NJ AFFINE_PICK(48, 1100)
#endif
#ifndef NK
#define NK AFFINE_PICK(56, 1200)
#endif

AFFINE_NOINLINE void kernel_gemm(double alpha, double beta, double C[restrict NI][NJ],
                                 const double A[restrict NI][NK], const double B[restrict NK][NJ]) {
  for (int i = 0; i < NI; i++) {
    for (int j = 0; j < NJ; j++)
      C[i][j] *= beta;
    /* row i of A*B as a combination of the rows of B: unit stride in j */
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++)
        C[i][j] += alpha * A[i][k] * B[k][j];
  }
}

int main(int argc, char **argv) {
  double(*A)[NK] = affine_alloc(sizeof(double[NI][NK]));
  double(*B)[NJ] = affine_alloc(sizeof(double[NK][NJ]));
  double(*C)[NJ] = affine_alloc(sizeof(double[NI][NJ]));
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++) A[i][k] = affine_value(1, i, k, 0);
  for (int k = 0; k < NK; k++)
    for (int j = 0; j < NJ; j++) B[k][j] = affine_value(2, k, j, 0);
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) C[i][j] = affine_value(3, i, j, 0);
  double seconds;
  AFFINE_TIME(seconds, kernel_gemm(1.5, 1.2, C, A, B));
  affine_finish(argc, argv, seconds, (const double *)C, (size_t)NI * NJ, (const double *)0);
  return 0;
}
