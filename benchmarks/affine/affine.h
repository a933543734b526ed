/* Shared harness of polyml's affine kernel suite (benchmarks/affine/).
 *
 * Every kernel file defines its problem sizes (a SMALL set, chosen with -DSMALL, for CI, and a
 * LARGE set, the default, for timing; each size can also be set alone with -DNAME=value),
 * allocates its float64 arrays, fills them deterministically, calls its kernel function once
 * (its own noinline function, so clang's -O1 -Xclang -disable-llvm-passes IR holds one clean
 * SCoP per kernel), and reports:
 *
 *   stdout:  "seconds <wall time of the kernel call>"   (clock_gettime, CLOCK_MONOTONIC)
 *   argv[1]: if given, the output arrays, raw float64 in the order the kernel lists them,
 *            written to that file (for comparing builds bit for bit).
 *
 * Each file gives two forms of its kernel, PolyBench-4 style.  The kernel function always takes
 * its sizes (and a stencil its time steps) as leading int arguments; its loop bounds and the
 * extents of its VLA array parameters are written AFFINE_N(param, CONSTANT):
 *
 *   parametric (the default): AFFINE_N is the int argument, as C kernels are written; main
 *       passes the sizes through affine_size(), a volatile read, so that no compiler (LTO,
 *       function specialization) can fold them into the kernel: its SCoP keeps them as
 *       parameters.
 *   constant (-DAFFINE_CONSTANT): AFFINE_N is the compile-time constant, the int arguments are
 *       unused; loop bounds and array strides are known to the compiler.
 *
 * Both forms do the same arithmetic in the same order, so their outputs are bit-identical.
 */
#ifndef POLYML_AFFINE_H
#define POLYML_AFFINE_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef SMALL
#define AFFINE_PICK(small, large) (small)
#else
#define AFFINE_PICK(small, large) (large)
#endif

#ifdef AFFINE_CONSTANT
#define AFFINE_N(param, constant) (constant)
#else
#define AFFINE_N(param, constant) (param)
#endif

#define AFFINE_NOINLINE __attribute__((noinline))

/* n, read back through a volatile: a value no optimizer may assume, for the kernel's size
 * arguments (they stay the kernel's parameters even if the kernel is specialized or inlined). */
static inline int affine_size(int n) {
  volatile int v = n;
  return v;
}

static inline double affine_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 64-byte aligned, zero-filled storage for `bytes` bytes. */
static void *affine_alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    exit(1);
  }
  memset(p, 0, rounded);
  return p;
}

/* A deterministic value in [0, 1) for index (a, b, c): a cheap integer hash, so that arrays
 * differ from each other (`salt`) and have no structure a compiler could exploit. */
static inline double affine_value(unsigned salt, long a, long b, long c) {
  unsigned long h = (unsigned long)salt * 0x9E3779B97F4A7C15ul;
  h ^= (unsigned long)a * 0xBF58476D1CE4E5B9ul;
  h ^= (unsigned long)b * 0x94D049BB133111EBul + ((unsigned long)c << 32);
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ul;
  h ^= h >> 29;
  return (double)(h >> 11) * 0x1.0p-53;
}

/* Print the kernel's time, then (argv[1] given) dump the output arrays: pairs of
 * (const double *data, size_t count) terminated by a NULL pointer. */
static void affine_finish(int argc, char **argv, double seconds, ...) {
  printf("seconds %.6f\n", seconds);
  if (argc < 2) return;
  FILE *f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    exit(1);
  }
  va_list ap;
  va_start(ap, seconds);
  for (;;) {
    const double *data = va_arg(ap, const double *);
    if (!data) break;
    size_t count = va_arg(ap, size_t);
    if (fwrite(data, sizeof(double), count, f) != count) {
      perror(argv[1]);
      exit(1);
    }
  }
  va_end(ap);
  fclose(f);
}

/* Time one call: `double seconds; AFFINE_TIME(seconds, kernel(...));` */
#define AFFINE_TIME(seconds, call)      \
  do {                                  \
    double affine_t0_ = affine_now();   \
    call;                               \
    (seconds) = affine_now() - affine_t0_; \
  } while (0)

#endif
