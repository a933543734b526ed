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

AFFINE_NOINLINE void kernel_covariance(double data[restrict N][M], double cov[restrict M][M],
                                       double mean[restrict M]) {
  for (int j = 0; j < M; j++) {
    mean[j] = 0.0;
    for (int i = 0; i < N; i++)
      mean[j] += data[i][j];
    mean[j] /= (double)N;
  }
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++)
      data[i][j] -= mean[j];
  for (int a = 0; a < M; a++)
    for (int b = a; b < M; b++) {
      cov[a][b] = 0.0;
      for (int i = 0; i < N; i++)
        cov[a][b] += data[i][a] * data[i][b];
      cov[a][b] /= (double)(N - 1);
      cov[b][a] = cov[a][b];
    }
}

int main(int argc, char **argv) {
  double(*data)[M] = affine_alloc(sizeof(double[N][M]));
  double(*cov)[M] = affine_alloc(sizeof(double[M][M]));
  double *mean = affine_alloc(sizeof(double[M]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) data[i][j] = affine_value(1, i, j, 0);
  double seconds;
  AFFINE_TIME(seconds, kernel_covariance(data, cov, mean));
  affine_finish(argc, argv, seconds, (const double *)cov, (size_t)M * M, (const double *)mean, (size_t)M,
                (const double *)data, (size_t)N * M, (const double *)0);
  return 0;
}
