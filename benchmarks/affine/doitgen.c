/* doitgen: a multiresolution-analysis kernel: every row A[r][q][:] of a 3-D array is multiplied
 * by the matrix X (NP x NP), A[r][q][p] = sum_s A[r][q][s] X[s][p], through the row buffer t. */
#include "affine.h"

#ifndef NR
#define NR AFFINE_PICK(10, 150)
#endif
#ifndef NQ
#define NQ AFFINE_PICK(8, 140)
#endif
#ifndef NP
#define NP AFFINE_PICK(12, 160)
#endif

AFFINE_NOINLINE void kernel_doitgen(int nr, int nq, int np,
                                    double A[restrict AFFINE_N(nr, NR)][AFFINE_N(nq, NQ)][AFFINE_N(np, NP)],
                                    const double X[restrict AFFINE_N(np, NP)][AFFINE_N(np, NP)],
                                    double t[restrict AFFINE_N(np, NP)]) {
  for (int r = 0; r < AFFINE_N(nr, NR); r++)
    for (int q = 0; q < AFFINE_N(nq, NQ); q++) {
      for (int p = 0; p < AFFINE_N(np, NP); p++) {
        t[p] = 0.0;
        for (int s = 0; s < AFFINE_N(np, NP); s++)
          t[p] += A[r][q][s] * X[s][p];
      }
      for (int p = 0; p < AFFINE_N(np, NP); p++)
        A[r][q][p] = t[p];
    }
}

int main(int argc, char **argv) {
  double(*A)[NQ][NP] = affine_alloc(sizeof(double[NR][NQ][NP]));
  double(*X)[NP] = affine_alloc(sizeof(double[NP][NP]));
  double *t = affine_alloc(sizeof(double[NP]));
  for (int r = 0; r < NR; r++)
    for (int q = 0; q < NQ; q++)
      for (int p = 0; p < NP; p++) A[r][q][p] = affine_value(1, r, q, p);
  for (int s = 0; s < NP; s++)
    for (int p = 0; p < NP; p++) X[s][p] = affine_value(2, s, p, 0);
  const int nr = affine_size(NR), nq = affine_size(NQ), np = affine_size(NP);
  double seconds;
  AFFINE_TIME(seconds, kernel_doitgen(nr, nq, np, A, X, t));
  affine_finish(argc, argv, seconds, (const double *)A, (size_t)NR * NQ * NP, (const double *)t, (size_t)NP,
                (const double *)0);
  return 0;
}
