/* covariance: the sample covariance matrix of N observations of M variables (data is N x M):
 *   mean[j] = sum_i data[i][j] / N;  data[i][j] -= mean[j];
 *   cov[a][b] = cov[b][a] = sum_i data[i][a] data[i][b] / (N - 1)   for a <= b. */
#include "affine.h"

#ifndef M
#define M AFFINE_PICK(28, 700)
#endif
#ifndef N
#define N AFFINE_PICK(32, 900)
#endif

AFFINE_NOINLINE void kernel_covariance(int m, int n, double data[restrict AFFINE_N(n, N)][AFFINE_N(m, M)],
                                       double cov[restrict AFFINE_N(m, M)][AFFINE_N(m, M)],
                                       double mean[restrict AFFINE_N(m, M)]) {
  for (int j = 0; j < AFFINE_N(m, M); j++) {
    mean[j] = 0.0;
    for (int i = 0; i < AFFINE_N(n, N); i++)
      mean[j] += data[i][j];
    mean[j] /= (double)AFFINE_N(n, N);
  }
  for (int i = 0; i < AFFINE_N(n, N); i++)
    for (int j = 0; j < AFFINE_N(m, M); j++)
      data[i][j] -= mean[j];
  for (int a = 0; a < AFFINE_N(m, M); a++)
    for (int b = a; b < AFFINE_N(m, M); b++) {
      cov[a][b] = 0.0;
      for (int i = 0; i < AFFINE_N(n, N); i++)
        cov[a][b] += data[i][a] * data[i][b];
      cov[a][b] /= (double)(AFFINE_N(n, N) - 1);
      cov[b][a] = cov[a][b];
    }
}

int main(int argc, char **argv) {
  double(*data)[M] = affine_alloc(sizeof(double[N][M]));
  double(*cov)[M] = affine_alloc(sizeof(double[M][M]));
  double *mean = affine_alloc(sizeof(double[M]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) data[i][j] = affine_value(1, i, j, 0);
  const int m = affine_size(M), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_covariance(m, n, data, cov, mean));
  affine_finish(argc, argv, seconds, (const double *)cov, (size_t)M * M, (const double *)mean, (size_t)M,
                (const double *)data, (size_t)N * M, (const double *)0);
  return 0;
}
