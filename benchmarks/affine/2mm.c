/* 2mm: D = alpha * A * B * C + beta * D, as T = alpha * A * B, then D = beta * D + T * C.
 * A is NI x NK, B is NK x NJ, C is NJ x NL, D is NI x NL; T (NI x NJ) is a temporary. */
#include "affine.h"

#ifndef NI
#define NI AFFINE_PICK(32, 800)
#endif
#ifndef NJ
#define NJ AFFINE_PICK(36, 900)
#endif
#ifndef NK
#define NK AFFINE_PICK(44, 1100)
#endif
#ifndef NL
#define NL AFFINE_PICK(48, 1200)
#endif

AFFINE_NOINLINE void kernel_2mm(int ni, int nj, int nk, int nl, double alpha, double beta,
                                double T[restrict AFFINE_N(ni, NI)][AFFINE_N(nj, NJ)],
                                const double A[restrict AFFINE_N(ni, NI)][AFFINE_N(nk, NK)],
                                const double B[restrict AFFINE_N(nk, NK)][AFFINE_N(nj, NJ)],
                                const double C[restrict AFFINE_N(nj, NJ)][AFFINE_N(nl, NL)],
                                double D[restrict AFFINE_N(ni, NI)][AFFINE_N(nl, NL)]) {
  for (int i = 0; i < AFFINE_N(ni, NI); i++)
    for (int j = 0; j < AFFINE_N(nj, NJ); j++) {
      T[i][j] = 0.0;
      for (int k = 0; k < AFFINE_N(nk, NK); k++)
        T[i][j] += alpha * A[i][k] * B[k][j];
    }
  for (int i = 0; i < AFFINE_N(ni, NI); i++)
    for (int l = 0; l < AFFINE_N(nl, NL); l++) {
      D[i][l] *= beta;
      for (int j = 0; j < AFFINE_N(nj, NJ); j++)
        D[i][l] += T[i][j] * C[j][l];
    }
}

int main(int argc, char **argv) {
  double(*T)[NJ] = affine_alloc(sizeof(double[NI][NJ]));
  double(*A)[NK] = affine_alloc(sizeof(double[NI][NK]));
  double(*B)[NJ] = affine_alloc(sizeof(double[NK][NJ]));
  double(*C)[NL] = affine_alloc(sizeof(double[NJ][NL]));
  double(*D)[NL] = affine_alloc(sizeof(double[NI][NL]));
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++) A[i][k] = affine_value(1, i, k, 0);
  for (int k = 0; k < NK; k++)
    for (int j = 0; j < NJ; j++) B[k][j] = affine_value(2, k, j, 0);
  for (int j = 0; j < NJ; j++)
    for (int l = 0; l < NL; l++) C[j][l] = affine_value(3, j, l, 0);
  for (int i = 0; i < NI; i++)
    for (int l = 0; l < NL; l++) D[i][l] = affine_value(4, i, l, 0);
  const int ni = affine_size(NI), nj = affine_size(NJ), nk = affine_size(NK), nl = affine_size(NL);
  double seconds;
  AFFINE_TIME(seconds, kernel_2mm(ni, nj, nk, nl, 1.5, 1.2, T, A, B, C, D));
  affine_finish(argc, argv, seconds, (const double *)T, (size_t)NI * NJ, (const double *)D, (size_t)NI * NL,
                (const double *)0);
  return 0;
}
