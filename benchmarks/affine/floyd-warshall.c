/* floyd-warshall: all-pairs shortest paths in place, d[i][j] = min(d[i][j], d[i][k] + d[k][j])
 * for k = 0 .. N-1 (edge weights in [1, 100), some pairs unconnected: weight 1e9). */
#include "affine.h"

#ifndef N
#define N AFFINE_PICK(60, 1000)
#endif

AFFINE_NOINLINE void kernel_floyd_warshall(int n, double d[restrict AFFINE_N(n, N)][AFFINE_N(n, N)]) {
  for (int k = 0; k < AFFINE_N(n, N); k++)
    for (int i = 0; i < AFFINE_N(n, N); i++)
      for (int j = 0; j < AFFINE_N(n, N); j++)
        d[i][j] = d[i][j] < d[i][k] + d[k][j] ? d[i][j] : d[i][k] + d[k][j];
}

int main(int argc, char **argv) {
  double(*d)[N] = affine_alloc(sizeof(double[N][N]));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      double w = affine_value(1, i, j, 0);
      d[i][j] = i == j ? 0.0 : w < 0.3 ? 1e9 : 1.0 + (double)(int)(99.0 * w);
    }
  const int n = affine_size(N);
  double seconds;
  AFFINE_TIME(seconds, kernel_floyd_warshall(n, d));
  affine_finish(argc, argv, seconds, (const double *)d, (size_t)N * N, (const double *)0);
  return 0;
}
