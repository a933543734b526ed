/* 3mm: G = (A * B) * (C * D) as E = A * B, F = C * D, G = E * F.
 * A is NI x NK, B is NK x NJ, C is NJ x NM, D is NM x NL. */
#include "affine.h"

#ifndef NI
#define NI AFFINE_PICK(32, 500)
#endif
#ifndef NJ
#define NJ AFFINE_PICK(36, 550)
#endif
#ifndef NK
#define NK AFFINE_PICK(40, 600)
#endif
#ifndef NL
#define NL AFFINE_PICK(44, 650)
#endif
#ifndef NM
#define NM AFFINE_PICK(48, 700)
#endif

AFFINE_NOINLINE void kernel_3mm(int ni, int nj, int nk, int nl, int nm,
                                double E[restrict AFFINE_N(ni, NI)][AFFINE_N(nj, NJ)],
                                const double A[restrict AFFINE_N(ni, NI)][AFFINE_N(nk, NK)],
                                const double B[restrict AFFINE_N(nk, NK)][AFFINE_N(nj, NJ)],
                                double F[restrict AFFINE_N(nj, NJ)][AFFINE_N(nl, NL)],
                                const double C[restrict AFFINE_N(nj, NJ)][AFFINE_N(nm, NM)],
                                const double D[restrict AFFINE_N(nm, NM)][AFFINE_N(nl, NL)],
                                double G[restrict AFFINE_N(ni, NI)][AFFINE_N(nl, NL)]) {
  for (int i = 0; i < AFFINE_N(ni, NI); i++)
    for (int j = 0; j < AFFINE_N(nj, NJ); j++) {
      E[i][j] = 0.0;
      for (int k = 0; k < AFFINE_N(nk, NK); k++)
        E[i][j] += A[i][k] * B[k][j];
    }
  for (int j = 0; j < AFFINE_N(nj, NJ); j++)
    for (int l = 0; l < AFFINE_N(nl, NL); l++) {
      F[j][l] = 0.0;
      for (int m = 0; m < AFFINE_N(nm, NM); m++)
        F[j][l] += C[j][m] * D[m][l];
    }
  for (int i = 0; i < AFFINE_N(ni, NI); i++)
    for (int l = 0; l < AFFINE_N(nl, NL); l++) {
      G[i][l] = 0.0;
      for (int j = 0; j < AFFINE_N(nj, NJ); j++)
        G[i][l] += E[i][j] * F[j][l];
    }
}

int main(int argc, char **argv) {
  double(*E)[NJ] = affine_alloc(sizeof(double[NI][NJ]));
  double(*A)[NK] = affine_alloc(sizeof(double[NI][NK]));
  double(*B)[NJ] = affine_alloc(sizeof(double[NK][NJ]));
  double(*F)[NL] = affine_alloc(sizeof(double[NJ][NL]));
  double(*C)[NM] = affine_alloc(sizeof(double[NJ][NM]));
  double(*D)[NL] = affine_alloc(sizeof(double[NM][NL]));
  double(*G)[NL] = affine_alloc(sizeof(double[NI][NL]));
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++) A[i][k] = affine_value(1, i, k, 0);
  for (int k = 0; k < NK; k++)
    for (int j = 0; j < NJ; j++) B[k][j] = affine_value(2, k, j, 0);
  for (int j = 0; j < NJ; j++)
    for (int m = 0; m < NM; m++) C[j][m] = affine_value(3, j, m, 0);
  for (int m = 0; m < NM; m++)
    for (int l = 0; l < NL; l++) D[m][l] = affine_value(4, m, l, 0);
  const int ni = affine_size(NI), nj = affine_size(NJ), nk = affine_size(NK), nl = affine_size(NL),
            nm = affine_size(NM);
  double seconds;
  AFFINE_TIME(seconds, kernel_3mm(ni, nj, nk, nl, nm, E, A, B, F, C, D, G));
  affine_finish(argc, argv, seconds, (const double *)E, (size_t)NI * NJ, (const double *)F, (size_t)NJ * NL,
                (const double *)G, (size_t)NI * NL, (const double *)0);
  return 0;
}
