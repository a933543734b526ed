/* bicg: the two products of BiCGStab's inner step, s = A^T r and q = A p, A is N x M. */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(42, 5000)
#endif
#ifndef M
#define M AFFINE_PICK(38, 4000)
#endif

AFFINE_NOINLINE void kernel_bicg(int n, int m, const double A[restrict AFFINE_N(n, N)][AFFINE_N(m, M)],
                                 double s[restrict AFFINE_N(m, M)], double q[restrict AFFINE_N(n, N)],
                                 const double p[restrict AFFINE_N(m, M)], const double r[restrict AFFINE_N(n, N)]) {
  for (int j = 0; j < AFFINE_N(m, M); j++)
    s[j] = 0.0;
  for (int i = 0; i < AFFINE_N(n, N); i++) {
    q[i] = 0.0;
    for (int j = 0; j < AFFINE_N(m, M); j++) {
      s[j] += r[i] * A[i][j];
      q[i] += A[i][j] * p[j];
    }
  }
}

int main(int argc, char **argv) {
  double(*A)[M] = affine_alloc(sizeof(double[N][M]));
  double *s = affine_alloc(sizeof(double[M]));
  double *q = affine_alloc(sizeof(double[N]));
  double *p = affine_alloc(sizeof(double[M]));
  double *r = affine_alloc(sizeof(double[N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) A[i][j] = affine_value(1, i, j, 0);
  for (int j = 0; j < M; j++) p[j] = affine_value(2, j, 0, 0);
  for (int i = 0; i < N; i++) r[i] = affine_value(3, i, 0, 0);
  const int n = affine_size(N), m = affine_size(M);
  double seconds;
  AFFINE_TIME(seconds, kernel_bicg(n, m, A, s, q, p, r));
  affine_finish(argc, argv, seconds, (const double *)s, (size_t)M, (const double *)q, (size_t)N, (const double *)0);
  return 0;
}
