/* The matrix products of a decode step on the CPU (fp32): y[m, o] = x[m, :] . w[o, :] + bias[o] for a few rows m
   (1 to gemv.MAX_ROWS sequences). At one row it is a stream of weight bytes; at sixteen it is as much arithmetic
   as reading. Each thread takes a range of weight rows NR at a time and multiplies them by the x rows MR at a
   time: MR x NR vector sums that load each operand once per vector of k (so the multiply-adds, not the loads, set
   the pace), while the next NR weight rows are prefetched (so the arithmetic and the memory overlap instead of
   taking turns). The tile fills the vector registers: 4x3 of 8 floats on AVX2 (16 registers), 4x6 of 16 floats
   where the compiler targets AVX-512 (32 registers; half the k steps, twice the sums a step). Measured against
   oneDNN's prepacked GEMM in bench.decode_linears (RESULTS.md, rounds 5 and 7). Built by gemv.py. */
#include "simd.h"

#ifndef GEMV_W  /* the weights' element type and how a vector (and one) of them is read: fp32 here; gemv_int8.c and
                   decode_layer_bf16.c include this file with int8 or bf16 weights, widened to floats as loaded */
#define GEMV_F32
#define GEMV_W float
#define GEMV_LOAD(p) (*(const vec *)(p))
#endif
#ifndef GEMV_AT
#define GEMV_AT(p) ((float)*(p))
#endif

#if VW == 16
#define NR 6   /* weight rows a tile: 4 x 6 = 24 sums of the 32 registers (4x5 and 4x4 measured no faster) */
#else
#define NR 3   /* 4 x 3 sums + 3 weight vectors + 1 x vector: all 16 registers */
#endif

/* NR1: weight rows a tile when x has one row (a single stream), 2 x NR: twice the independent sums, so the
   multiply-adds do not wait on each other's latency (two threads' int8 products widened to floats: 14.4 -> 15.4 GB/s,
   interleaved A/B on the AVX2 bench machine; 3 x NR measured slower) */
#if VW == 16
#define NR1 12
#else
#define NR1 6
#endif

#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 64  /* weights past the same k in the next NR weight rows: a cache line or more ahead */
#endif

/* y[a, b] = x[a, :] . w[b, :] (* scale[b]) (+ bias[b]) for MR rows of x and N rows of w (row strides `in` and
   `out`); scale: int8 weights' per-row scale, NULL for fp32. */
#define TILE_(MR, N)                                                                                              \
    static inline void tile_##MR##x##N(const float *x, const GEMV_W *w, const float *scale, const float *bias,    \
                                       float *y, int64_t out, int64_t in) {                                       \
        vec acc[MR][N];                                                                                           \
        for (int a = 0; a < MR; a++)                                                                              \
            for (int b = 0; b < N; b++) acc[a][b] = (vec){0};                                                     \
        int64_t k = 0;                                                                                            \
        for (; k + VW <= in; k += VW) {                                                                           \
            vec wv[N];                                                                                            \
            for (int b = 0; b < N; b++) {                                                                         \
                wv[b] = GEMV_LOAD(w + b * in + k);                                                                \
                if (MR > 2) IN_REGISTER(wv[b]);  /* one load, not MR (fewer rows: folded loads measured no slower) */\
                __builtin_prefetch(w + (N + b) * in + k + PREFETCH_AHEAD, 0, 0);                                  \
            }                                                                                                     \
            for (int a = 0; a < MR; a++) {                                                                        \
                vec xv = *(const vec *)(x + a * in + k);                                                          \
                for (int b = 0; b < N; b++) acc[a][b] += xv * wv[b];                                              \
            }                                                                                                     \
        }                                                                                                         \
        for (int a = 0; a < MR; a++)                                                                              \
            for (int b = 0; b < N; b++) {                                                                         \
                float r = hsum(acc[a][b]);                                                                        \
                for (int64_t j = k; j < in; j++) r += x[a * in + j] * GEMV_AT(w + b * in + j);                    \
                y[a * out + b] = (scale ? r * scale[b] : r) + (bias ? bias[b] : 0.f);                             \
            }                                                                                                     \
    }
#define TILE(MR, N) TILE_(MR, N)  /* expands NR before pasting the name */
TILE(4, NR) TILE(3, NR) TILE(2, NR) TILE(1, NR) TILE(1, NR1) TILE(4, 1) TILE(1, 1)
#define TILE_NAME(MR, N) tile_##MR##x##N
#define TILE_OF(MR, N) TILE_NAME(MR, N)

/* Weight rows a block takes: NR1 for one x row, else NR. */
static inline int64_t block_rows(int64_t rows) { return rows == 1 ? NR1 : NR; }

/* Weight rows [o, o + n) (n <= block_rows(rows)) against all x rows: y[:, o:o + n]. While the tiles of the x rows
   run, these weight rows stay in the cache. */
static inline void gemv_block(const float *x, const GEMV_W *w, const float *scale, const float *bias, float *y,
                              int64_t rows, int64_t out, int64_t in, int64_t o, int64_t n) {
    const GEMV_W *wo = w + o * in;
    const float *so = scale ? scale + o : 0, *bo = bias ? bias + o : 0;
    int64_t m = 0;
    if (n > NR) {  /* one x row, NR1 weight rows (block_rows): one wide tile, or NR at a time at the end */
        if (n == NR1) {
            TILE_OF(1, NR1)(x, wo, so, bo, y + o, out, in);
        } else {
            gemv_block(x, w, scale, bias, y, rows, out, in, o, NR);
            gemv_block(x, w, scale, bias, y, rows, out, in, o + NR, n - NR);
        }
    } else if (n == NR) {
        for (; m + 4 <= rows; m += 4) TILE_OF(4, NR)(x + m * in, wo, so, bo, y + m * out + o, out, in);
        switch (rows - m) {
        case 3: TILE_OF(3, NR)(x + m * in, wo, so, bo, y + m * out + o, out, in); break;
        case 2: TILE_OF(2, NR)(x + m * in, wo, so, bo, y + m * out + o, out, in); break;
        case 1: TILE_OF(1, NR)(x + m * in, wo, so, bo, y + m * out + o, out, in); break;
        }
    } else {  /* the last weight rows, fewer than NR */
        for (int64_t b = o; b < o + n; b++) {
            const GEMV_W *wb = w + b * in;
            const float *sb = scale ? scale + b : 0, *bb = bias ? bias + b : 0;
            for (m = 0; m + 4 <= rows; m += 4) tile_4x1(x + m * in, wb, sb, bb, y + m * out + b, out, in);
            for (; m < rows; m++) tile_1x1(x + m * in, wb, sb, bb, y + m * out + b, out, in);
        }
    }
}

/* A thread's share, inside a team already running (decode_layer.c runs a whole step in one team); no barrier at the
   end: the caller says when the team waits. */
static void gemv_team(const float *x, const GEMV_W *w, const float *scale, const float *bias, float *y, int64_t rows,
                      int64_t out, int64_t in) {
#ifdef GEMV_Q8_X  /* int8 weights: int8 x where the width allows (q8_activations.h) */
    if (q8_team(x, w, scale, bias, y, rows, out, in)) return;
#endif
    const int64_t B = block_rows(rows), blocks = (out + B - 1) / B;
#pragma omp for schedule(static) nowait
    for (int64_t ob = 0; ob < blocks; ob++)
        gemv_block(x, w, scale, bias, y, rows, out, in, B * ob, out - B * ob < B ? out - B * ob : B);
}

#ifdef GEMV_F32
void gemv_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t out, int64_t in,
              int threads) {
#pragma omp parallel num_threads(threads)
    gemv_team(x, w, 0, bias, y, rows, out, in);
}
#endif
