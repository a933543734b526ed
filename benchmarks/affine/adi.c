/* adi: TSTEPS steps of the Peaceman-Rachford alternating-direction implicit method for the 2-D
 * heat equation u_t = u_xx + u_yy on an N x N grid (boundary fixed).  Each step is two half
 * steps; each solves one tridiagonal system per grid line with the Thomas algorithm:
 *   column sweep (implicit in i, explicit in j), for each column j:
 *     -r v[i-1][j] + (1+2r) v[i][j] - r v[i+1][j] = r u[i][j-1] + (1-2r) u[i][j] + r u[i][j+1]
 *   row sweep (implicit in j, explicit in i), for each row i:
 *     -r u[i][j-1] + (1+2r) u[i][j] - r u[i][j+1] = r v[i-1][j] + (1-2r) v[i][j] + r v[i+1][j]
 * with r = dt / (2 h^2); c and d hold the eliminated super-diagonal and right-hand side. */
#include "affine.h"

#ifndef TSTEPS
#define TSTEPS AFFINE_PICK(4, 40)
#endif
#ifndef N
#define N AFFINE_PICK(30, 800)
#endif

AFFINE_NOINLINE void kernel_adi(int tsteps, int n, double u[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                double v[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                double c[restrict AFFINE_N(n, N)][AFFINE_N(n, N)],
                                double d[restrict AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  const double h = 1.0 / (double)AFFINE_N(n, N), dt = 1.0 / (double)AFFINE_N(tsteps, TSTEPS);
  const double r = dt / (2.0 * h * h);
  const double a = -r, b = 1.0 + 2.0 * r; /* sub/super-diagonal, diagonal */
  for (int t = 0; t < AFFINE_N(tsteps, TSTEPS); t++) {
    /* column sweep: v from u */
    for (int j = 1; j < AFFINE_N(n, N) - 1; j++) {
      v[0][j] = u[0][j];
      c[0][j] = 0.0;
      d[0][j] = u[0][j];
      for (int i = 1; i < AFFINE_N(n, N) - 1; i++) {
        c[i][j] = -a / (a * c[i - 1][j] + b);
        d[i][j] = (r * u[i][j - 1] + (1.0 - 2.0 * r) * u[i][j] + r * u[i][j + 1] - a * d[i - 1][j]) /
                  (a * c[i - 1][j] + b);
      }
      v[AFFINE_N(n, N) - 1][j] = u[AFFINE_N(n, N) - 1][j];
      for (int i = AFFINE_N(n, N) - 2; i >= 1; i--)
        v[i][j] = c[i][j] * v[i + 1][j] + d[i][j];
    }
    /* row sweep: u from v */
    for (int i = 1; i < AFFINE_N(n, N) - 1; i++) {
      u[i][0] = v[i][0];
      c[i][0] = 0.0;
      d[i][0] = v[i][0];
      for (int j = 1; j < AFFINE_N(n, N) - 1; j++) {
        c[i][j] = -a / (a * c[i][j - 1] + b);
        d[i][j] = (r * v[i - 1][j] + (1.0 - 2.0 * r) * v[i][j] + r * v[i + 1][j] - a * d[i][j - 1]) /
                  (a * c[i][j - 1] + b);
      }
      u[i][AFFINE_N(n, N) - 1] = v[i][AFFINE_N(n, N) - 1];
      for (int j = AFFINE_N(n, N) - 2; j >= 1; j--)
        u[i][j] = c[i][j] * u[i][j + 1] + d[i][j];
    }
  }
}

int main(int argc, char **argv) {
  double(*u)[N] = affine_alloc(sizeof(double[N][N]));
  double(*v)[N] = affine_alloc(sizeof(double[N][N]));
  double(*c)[N] = affine_alloc(sizeof(double[N][N]));
  double(*d)[N] = affine_alloc(sizeof(double[N][N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      u[i][j] = affine_value(1, i, j, 0);
      v[i][j] = u[i][j];
    }
  const int tsteps = affine_size(TSTEPS), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_adi(tsteps, n, u, v, c, d));
  affine_finish(argc, argv, seconds, (const double *)u, (size_t)N * N, (const double *)v, (size_t)N * N,
                (const double *)0);
  return 0;
}
