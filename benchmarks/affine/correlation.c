/* correlation: the Pearson correlation matrix of N observations of M variables (data is N x M):
 *   mean[j] = sum_i data[i][j] / N;  sd[j] = sqrt(sum_i (data[i][j] - mean[j])^2 / N);
 *   data[i][j] = (data[i][j] - mean[j]) / (sqrt(N) sd[j]);
 *   corr[a][b] = corr[b][a] = sum_i data[i][a] data[i][b]   for a < b,  corr[a][a] = 1.
 * (The inputs are random, so no variable is constant and sd > 0.) */
#include "affine.h"

#ifndef M
#define M AFFINE_PICK(28, 700)
#endif
#ifndef N
#define N AFFINE_PICK(32, 900)
#endif

AFFINE_NOINLINE void kernel_correlation(int m, int n, double data[restrict AFFINE_N(n, N)][AFFINE_N(m, M)],
                                        double corr[restrict AFFINE_N(m, M)][AFFINE_N(m, M)],
                                        double mean[restrict AFFINE_N(m, M)], double sd[restrict AFFINE_N(m, M)]) {
  for (int j = 0; j < AFFINE_N(m, M); j++) {
    mean[j] = 0.0;
    for (int i = 0; i < AFFINE_N(n, N); i++)
      mean[j] += data[i][j];
    mean[j] /= (double)AFFINE_N(n, N);
  }
  for (int j = 0; j < AFFINE_N(m, M); j++) {
    sd[j] = 0.0;
    for (int i = 0; i < AFFINE_N(n, N); i++)
      sd[j] += (data[i][j] - mean[j]) * (data[i][j] - mean[j]);
    sd[j] = sqrt(sd[j] / (double)AFFINE_N(n, N));
  }
  for (int i = 0; i < AFFINE_N(n, N); i++)
    for (int j = 0; j < AFFINE_N(m, M); j++)
      data[i][j] = (data[i][j] - mean[j]) / (sqrt((double)AFFINE_N(n, N)) * sd[j]);
  for (int a = 0; a < AFFINE_N(m, M); a++) {
    corr[a][a] = 1.0;
    for (int b = a + 1; b < AFFINE_N(m, M); b++) {
      corr[a][b] = 0.0;
      for (int i = 0; i < AFFINE_N(n, N); i++)
        corr[a][b] += data[i][a] * data[i][b];
      corr[b][a] = corr[a][b];
    }
  }
}

int main(int argc, char **argv) {
  double(*data)[M] = affine_alloc(sizeof(double[N][M]));
  double(*corr)[M] = affine_alloc(sizeof(double[M][M]));
  double *mean = affine_alloc(sizeof(double[M])), *sd = affine_alloc(sizeof(double[M]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) data[i][j] = affine_value(1, i, j, 0);
  const int m = affine_size(M), n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_correlation(m, n, data, corr, mean, sd));
  affine_finish(argc, argv, seconds, (const double *)corr, (size_t)M * M, (const double *)mean, (size_t)M,
                (const double *)sd, (size_t)M, (const double *)data, (size_t)N * M, (const double *)0);
  return 0;
}
