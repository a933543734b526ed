/* fdtd-2d: TSTEPS steps of the 2-D finite-difference time-domain method (Yee scheme, TE mode):
 * electric fields ex, ey and magnetic field hz on an NX x NY grid, a plane-wave source
 * src[t] on the row ey[0][:]:
 *   ey[i][j] -= 0.5 (hz[i][j] - hz[i-1][j]);  ex[i][j] -= 0.5 (hz[i][j] - hz[i][j-1]);
 *   hz[i][j] -= 0.7 (ex[i][j+1] - ex[i][j] + ey[i+1][j] - ey[i][j]). */
#include "affine.h"

#ifndef TSTEPS
#define TSTEPS AFFINE_PICK(6, 200)
#endif
#ifndef NX
#define NX AFFINE_PICK(30, 800)
#endif
#ifndef NY
#define NY AFFINE_PICK(36, 1000)
#endif

AFFINE_NOINLINE void kernel_fdtd_2d(int tsteps, int nx, int ny, double ex[restrict AFFINE_N(nx, NX)][AFFINE_N(ny, NY)],
                                    double ey[restrict AFFINE_N(nx, NX)][AFFINE_N(ny, NY)],
                                    double hz[restrict AFFINE_N(nx, NX)][AFFINE_N(ny, NY)],
                                    const double src[restrict AFFINE_N(tsteps, TSTEPS)]) {
  for (int t = 0; t < AFFINE_N(tsteps, TSTEPS); t++) {
    for (int j = 0; j < AFFINE_N(ny, NY); j++)
      ey[0][j] = src[t];
    for (int i = 1; i < AFFINE_N(nx, NX); i++)
      for (int j = 0; j < AFFINE_N(ny, NY); j++)
        ey[i][j] = ey[i][j] - 0.5 * (hz[i][j] - hz[i - 1][j]);
    for (int i = 0; i < AFFINE_N(nx, NX); i++)
      for (int j = 1; j < AFFINE_N(ny, NY); j++)
        ex[i][j] = ex[i][j] - 0.5 * (hz[i][j] - hz[i][j - 1]);
    for (int i = 0; i < AFFINE_N(nx, NX) - 1; i++)
      for (int j = 0; j < AFFINE_N(ny, NY) - 1; j++)
        hz[i][j] = hz[i][j] - 0.7 * (ex[i][j + 1] - ex[i][j] + ey[i + 1][j] - ey[i][j]);
  }
}

int main(int argc, char **argv) {
  double(*ex)[NY] = affine_alloc(sizeof(double[NX][NY]));
  double(*ey)[NY] = affine_alloc(sizeof(double[NX][NY]));
  double(*hz)[NY] = affine_alloc(sizeof(double[NX][NY]));
  double *src = affine_alloc(sizeof(double[TSTEPS]));
  for (int t = 0; t < TSTEPS; t++) src[t] = (double)t;
  for (int i = 0; i < NX; i++)
    for (int j = 0; j < NY; j++) {
      ex[i][j] = affine_value(1, i, j, 0);
      ey[i][j] = affine_value(2, i, j, 0);
      hz[i][j] = affine_value(3, i, j, 0);
    }
  const int tsteps = affine_size(TSTEPS), nx = affine_size(NX), ny = affine_size(NY);
  double seconds;
  AFFINE_TIME(seconds, kernel_fdtd_2d(tsteps, nx, ny, ex, ey, hz, src));
  affine_finish(argc, argv, seconds, (const double *)ex, (size_t)NX * NY, (const double *)ey, (size_t)NX * NY,
                (const double *)hz, (size_t)NX * NY, (const double *)0);
  return 0;
}
