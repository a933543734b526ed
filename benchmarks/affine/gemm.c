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

AFFINE_NOINLINE void kernel_gemm(int ni, int nj, int nk, double alpha, double beta,
                                 double C[restrict AFFINE_N(ni, NI)][AFFINE_N(nj, NJ)],
                                 const double A[restrict AFFINE_N(ni, NI)][AFFINE_N(nk, NK)],
                                 const double B[restrict AFFINE_N(nk, NK)][AFFINE_N(nj, NJ)]) {
  for (int i = 0; i < AFFINE_N(ni, NI); i++) {
    for (int j = 0; j < AFFINE_N(nj, NJ); j++)
      C[i][j] *= beta;
    /* row i of A*B as a combination of the rows of B: unit stride in j */
    for (int k = 0; k < AFFINE_N(nk, NK); k++)
      for (int j = 0; j < AFFINE_N(nj, NJ); j++)
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
  const int ni = affine_size(NI), nj = affine_size(NJ), nk = affine_size(NK);
  double seconds;
  AFFINE_TIME(seconds, kernel_gemm(ni, nj, nk, 1.5, 1.2, C, A, B));
  affine_finish(argc, argv, seconds, (const double *)C, (size_t)NI * NJ, (const double *)0);
  return 0;
}
