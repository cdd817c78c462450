/* The matrix products of a decode step on the CPU (fp32): y[m, o] = x[m, :] . w[o, :] + bias[o] for a few rows m
   (1 to gemv.MAX_ROWS sequences). At one row it is a stream of weight bytes; at sixteen it is as much arithmetic
   as reading. Each thread takes a range of weight rows three at a time and multiplies them by the x rows four at
   a time: twelve 8-wide sums that load each operand once per 8 k (so the multiply-adds, not the loads, set the
   pace), while the next three weight rows are prefetched (so the arithmetic and the memory overlap instead of
   taking turns). Measured here against oneDNN's prepacked GEMM (bench.decode_linears): 1.3x at 1 row, 1.4-1.6x
   at 2 to 8, 1.1x at 16, even at 32. Built by gemv.py. */
#include <stdint.h>

typedef float v8 __attribute__((vector_size(32), aligned(4)));  /* 8 floats, any alignment: SIMD on x86 and ARM */

#define PREFETCH_AHEAD 64  /* floats past the same k in the next three weight rows: one cache line beyond */

static inline float hsum(v8 s) { return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])); }

/* y[a, b] = x[a, :] . w[b, :] (+ bias[b]) for MR rows of x and NR rows of w (row strides `in` and `out`). */
#define TILE(MR, NR)                                                                                              \
    static inline void tile_##MR##x##NR(const float *x, const float *w, const float *bias, float *y, int64_t out, \
                                        int64_t in) {                                                             \
        v8 acc[MR][NR];                                                                                           \
        for (int a = 0; a < MR; a++)                                                                              \
            for (int b = 0; b < NR; b++) acc[a][b] = (v8){0};                                                     \
        int64_t k = 0;                                                                                            \
        for (; k + 8 <= in; k += 8) {                                                                             \
            v8 wv[NR];                                                                                            \
            for (int b = 0; b < NR; b++) {                                                                        \
                wv[b] = *(const v8 *)(w + b * in + k);                                                            \
                __builtin_prefetch(w + (NR + b) * in + k + PREFETCH_AHEAD, 0, 0);                                 \
            }                                                                                                     \
            for (int a = 0; a < MR; a++) {                                                                        \
                v8 xv = *(const v8 *)(x + a * in + k);                                                            \
                for (int b = 0; b < NR; b++) acc[a][b] += xv * wv[b];                                             \
            }                                                                                                     \
        }                                                                                                         \
        for (int a = 0; a < MR; a++)                                                                              \
            for (int b = 0; b < NR; b++) {                                                                        \
                float r = hsum(acc[a][b]);                                                                        \
                for (int64_t j = k; j < in; j++) r += x[a * in + j] * w[b * in + j];                              \
                y[a * out + b] = r + (bias ? bias[b] : 0.f);                                                      \
            }                                                                                                     \
    }
TILE(4, 3) TILE(3, 3) TILE(2, 3) TILE(1, 3) TILE(4, 1) TILE(1, 1)

void gemv_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t out, int64_t in,
              int threads) {
    const int64_t blocks = (out + 2) / 3;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t ob = 0; ob < blocks; ob++) {
        const int64_t o = 3 * ob;
        const float *wo = w + o * in, *bo = bias ? bias + o : 0;
        int64_t m = 0;
        if (o + 3 <= out) {  /* all x rows against these three weight rows, which stay in the cache meanwhile */
            for (; m + 4 <= rows; m += 4) tile_4x3(x + m * in, wo, bo, y + m * out + o, out, in);
            switch (rows - m) {
            case 3: tile_3x3(x + m * in, wo, bo, y + m * out + o, out, in); break;
            case 2: tile_2x3(x + m * in, wo, bo, y + m * out + o, out, in); break;
            case 1: tile_1x3(x + m * in, wo, bo, y + m * out + o, out, in); break;
            }
        } else {  /* the last one or two weight rows */
            for (int64_t b = o; b < out; b++) {
                const float *wb = w + b * in, *bb = bias ? bias + b : 0;
                for (m = 0; m + 4 <= rows; m += 4) tile_4x1(x + m * in, wb, bb, y + m * out + b, out, in);
                for (; m < rows; m++) tile_1x1(x + m * in, wb, bb, y + m * out + b, out, in);
            }
        }
    }
}
