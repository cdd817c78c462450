/* int4 weights times int8 activations (quantization="int4"): y[m, o] = x[m, :] . w[o, :] + bias[o] for a few fp32
   rows x (a decode step), w in the engine's int4 format (quantized.Int4Linear: per group of 64 or 128 input
   channels a scale s and a zero point, w = q * s + min with q in 0..15), read as nibbles. PyTorch's int4 kernel
   (`_weight_int4pack_mm_for_cpu`, the only maintained one on x86) widens every nibble to a float and multiplies by
   bf16 inputs: it read 15 GB/s of int4 bytes, no faster than int8 (bench/RESULTS.md, issue #57). Here, as
   llama.cpp's Q4 x Q8 does, the input rows are quantized to int8 in blocks of 32 (q8_activations.h's Q8_0 blocks)
   and 64 weights take one integer dot instruction (AVX-512 VNNI `vpdpbusd`: unsigned nibbles x signed bytes) or two
   (AVX2 `vpmaddubsw` + `vpmaddwd`), one float multiply-add a block scale, one a group scale.

   The sum of a group:  sum_k (q_k s + min) x_k = s * sum_k q_k x_k + min * sum_k x_k,  so each input block's own
   sum (d_b * sum of its int8 values) is taken once per product, and a group costs one multiply-add for its minimum.

   Layout (decode_layer.py / gemv_int4.py pack it): a row is in / 2 bytes, 64 weights a 32-byte chunk, byte j holding
   weight j in its low nibble and weight j + 32 in its high one, so one chunk's low nibbles are one input block and
   its high nibbles the next. Included by gemv_int4.c (one product a call) and decode_layer_int4.c (a whole step). */
#ifndef MINIVLM_INT4_WEIGHTS_H
#define MINIVLM_INT4_WEIGHTS_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "simd.h"
#include "q8_activations.h"  /* x86 with AVX2: q8_quantize (Q8X, Q8_BLOCK) */
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define GEMV_INT4
#define I4_CHUNK 64  /* weights a 32-byte chunk */
#ifndef I4_NR
#define I4_NR 4      /* weight rows a tile (one x row at a time): 4 x 2 sums in flight */
#endif
#ifndef I4_AHEAD
#define I4_AHEAD 256     /* bytes ahead in the next tile's rows */
#endif
#ifndef I4_STREAM
#define I4_STREAM 8192   /* bytes ahead of the tile's progress, read as one stream (q8_activations.h's Q8_STREAM:
                            rows of 512 bytes are too short for the next tile's prefetch alone) */
#endif

typedef struct {        /* one matrix (decode_layer.py's Int4W) */
    const uint8_t *q;   /* [out, in / 2], the chunks above */
    const float *sm;    /* [out, in / group, 2]: each group's scale and minimum */
    int64_t group;      /* a multiple of I4_CHUNK */
} Int4W;
#define GEMV_W Int4W

typedef struct {
    const int8_t *q;    /* [rows, in] */
    const float *d;     /* [rows, in / 32]: each block's scale */
    const float *sum;   /* [rows, in / 32]: each block's d * sum of its values (what the minima multiply) */
} I4X;

/* A buffer of this thread's that grows (as q8_quantize's): a team's threads each take the same path, so one that
   cannot grow ends the process with a message. */
static void *i4_buffer(int64_t need) {
    static __thread void *buf;
    static __thread int64_t cap;
    if (need > cap) {
        void *grown = realloc(buf, need);
        if (!grown) {
            fprintf(stderr, "minivlm int4_weights.h: out of memory for %lld bytes\n", (long long)need);
            abort();
        }
        buf = grown, cap = need;
    }
    return buf;
}

/* x's rows in int8 blocks of 32 (max |x| / 127 a block, rounded to nearest even: Q8_0), and each block's sum. */
static I4X i4_quantize(const float *x, int64_t rows, int64_t in) {
    const int64_t nb = rows * (in / 32);
#if defined(__AVX2__)
    const Q8X q8 = q8_quantize(x, rows, in);
    const int8_t *q = q8.q;
    const float *d = q8.s;
    float *sum = i4_buffer(nb * (int64_t)sizeof(float));
#else  /* the same numbers without AVX2 (nearbyintf rounds to nearest even, as the vector conversion does) */
    int8_t *q = i4_buffer(rows * in + 2 * nb * (int64_t)sizeof(float));
    float *d = (float *)(q + rows * in), *sum = d + nb;
    for (int64_t i = 0; i < nb; i++) {
        float mx = 0.f;
        for (int j = 0; j < 32; j++) mx = fmaxf(mx, fabsf(x[i * 32 + j]));
        d[i] = mx / 127.f;
        const float inv = mx > 0.f ? 127.f / mx : 0.f;
        for (int j = 0; j < 32; j++) q[i * 32 + j] = (int8_t)nearbyintf(x[i * 32 + j] * inv);
    }
#endif
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += q[i * 32 + j];
        sum[i] = d[i] * (float)s;
    }
    return (I4X){q, d, sum};
}

/* (k >> 5: k is never negative, and a shift spares the sign fix-up a signed division costs in the inner loop.)
   One x row (xq, its block scales xd and sums xs) against N weight rows from `row`: a group at a time, the blocks'
   products summed in floats with their input scales (acc_g), then times each row's group scale (acc). */
static inline __attribute__((always_inline)) void i4_tile(const int8_t *xq, const float *xd, const float *xs,
                                                          const Int4W *w, int64_t row, const float *bias, float *y,
                                                          int64_t in, const int N) {
    const int64_t rb = in / 2, G = w->group, ng = in / G;
    const uint8_t *wq = w->q + row * rb;
    const float *sm = w->sm + row * ng * 2;
    float mins[I4_NR] = {0};
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(I4_NO_VNNI) && !defined(I4_PORTABLE)
    __m512 acc[I4_NR];
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int b = 0; b < N; b++) acc[b] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512 accg[I4_NR];
        for (int b = 0; b < N; b++) accg[b] = _mm512_setzero_ps();
        for (int64_t k = g * G; k < (g + 1) * G; k += I4_CHUNK) {
            const __m512i xv = _mm512_loadu_si512(xq + k);  /* two blocks: lanes 0-7 the first, 8-15 the second */
            const __m512 dv = _mm512_insertf32x8(_mm512_set1_ps(xd[k >> 5]), _mm256_set1_ps(xd[(k >> 5) + 1]), 1);
            for (int b = 0; b < N; b++) {
                const uint8_t *p = wq + b * rb + (k >> 1);
                if (!(k & 127)) {  /* a cache line a row in the next tile's rows, one on the tile's stream */
                    __builtin_prefetch(p + N * rb + I4_AHEAD, 0, 0);
                    __builtin_prefetch(wq + (k >> 1) * N + b * 64 + I4_STREAM, 0, 0);
                }
                /* the chunk in both halves, the upper half shifted to its high nibbles: the 64 weights in order */
                __m512i wv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
                wv = _mm512_and_si512(_mm512_mask_srli_epi16(wv, 0xFFFF0000u, wv, 4), low);
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
                accg[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dv, accg[b]);
            }
        }
        float xsum = 0.f;
        for (int64_t blk = g * G / 32; blk < (g + 1) * G / 32; blk++) xsum += xs[blk];
        for (int b = 0; b < N; b++) {
            acc[b] = _mm512_fmadd_ps(accg[b], _mm512_set1_ps(sm[b * ng * 2 + 2 * g]), acc[b]);
            mins[b] += sm[b * ng * 2 + 2 * g + 1] * xsum;
        }
    }
    for (int b = 0; b < N; b++) y[b] = _mm512_reduce_add_ps(acc[b]) + mins[b] + (bias ? bias[b] : 0.f);
#elif defined(__AVX2__) && !defined(I4_PORTABLE)
    __m256 acc[I4_NR];
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int b = 0; b < N; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256 accg[I4_NR];
        for (int b = 0; b < N; b++) accg[b] = _mm256_setzero_ps();
        for (int64_t k = g * G; k < (g + 1) * G; k += I4_CHUNK) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + k));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + k + 32));
            const __m256 d0 = _mm256_broadcast_ss(xd + (k >> 5)), d1 = _mm256_broadcast_ss(xd + (k >> 5) + 1);
            for (int b = 0; b < N; b++) {
                const uint8_t *p = wq + b * rb + (k >> 1);
                if (!(k & 127)) {
                    __builtin_prefetch(p + N * rb + I4_AHEAD, 0, 0);
                    __builtin_prefetch(wq + (k >> 1) * N + b * 64 + I4_STREAM, 0, 0);
                }
                const __m256i v = _mm256_loadu_si256((const __m256i *)p);
                const __m256i w0 = _mm256_and_si256(v, low), w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                /* unsigned nibbles x signed bytes: pairs of products stay within int16 (2 x 15 x 127) */
                const __m256i s0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, x0), ones);
                const __m256i s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, x1), ones);
                accg[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), d0, accg[b]);
                accg[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), d1, accg[b]);
            }
        }
        float xsum = 0.f;
        for (int64_t blk = g * G / 32; blk < (g + 1) * G / 32; blk++) xsum += xs[blk];
        for (int b = 0; b < N; b++) {
            acc[b] = _mm256_fmadd_ps(accg[b], _mm256_set1_ps(sm[b * ng * 2 + 2 * g]), acc[b]);
            mins[b] += sm[b * ng * 2 + 2 * g + 1] * xsum;
        }
    }
    for (int b = 0; b < N; b++) y[b] = q8_hsum(acc[b]) + mins[b] + (bias ? bias[b] : 0.f);
#else  /* portable: integer sums a block in plain C (the compiler vectorises what the target has). I4_NO_VNNI and
          I4_PORTABLE (-D flags) force the paths below the CPU's best: tests check each against the same numbers */
    for (int b = 0; b < N; b++) {
        float acc = 0.f;
        for (int64_t g = 0; g < ng; g++) {
            float accg = 0.f, xsum = 0.f;
            for (int64_t k = g * G; k < (g + 1) * G; k += I4_CHUNK) {
                const uint8_t *p = wq + b * rb + (k >> 1);
                int32_t s0 = 0, s1 = 0;
                for (int j = 0; j < 32; j++) {
                    s0 += (p[j] & 15) * xq[k + j];
                    s1 += (p[j] >> 4) * xq[k + 32 + j];
                }
                accg += (float)s0 * xd[k >> 5] + (float)s1 * xd[(k >> 5) + 1];
            }
            for (int64_t blk = g * G / 32; blk < (g + 1) * G / 32; blk++) xsum += xs[blk];
            acc += accg * sm[b * ng * 2 + 2 * g];
            mins[b] += sm[b * ng * 2 + 2 * g + 1] * xsum;
        }
        y[b] = acc + mins[b] + (bias ? bias[b] : 0.f);
    }
#endif
}

/* Weight rows [o, o + n) (n <= I4_NR) against every x row: y[:, o:o + n]; the rows stay in the cache meanwhile. */
static inline void i4_block(I4X x, const Int4W *w, const float *bias, float *y, int64_t rows, int64_t out, int64_t in,
                            int64_t o, int64_t n) {
    const int64_t nb = in / 32;
    for (int64_t m = 0; m < rows; m++) {
        const int8_t *xq = x.q + m * in;
        const float *xd = x.d + m * nb, *xs = x.sum + m * nb;
        if (n == I4_NR)
            i4_tile(xq, xd, xs, w, o, bias ? bias + o : 0, y + m * out + o, in, I4_NR);
        else
            for (int64_t b = o; b < o + n; b++) i4_tile(xq, xd, xs, w, b, bias ? bias + b : 0, y + m * out + b, in, 1);
    }
}

/* A thread's share of y = x . w^T + bias inside a running team (decode_layer.c's name for it; `scale` unused: the
   scales are in w). No barrier at the end: the caller says when the team waits. */
static void gemv_team(const float *x, const Int4W *w, const float *scale, const float *bias, float *y, int64_t rows,
                      int64_t out, int64_t in) {
    (void)scale;
    const I4X qx = i4_quantize(x, rows, in);
    const int64_t blocks = (out + I4_NR - 1) / I4_NR;
#pragma omp for schedule(static) nowait
    for (int64_t ob = 0; ob < blocks; ob++)
        i4_block(qx, w, bias, y, rows, out, in, I4_NR * ob, out - I4_NR * ob < I4_NR ? out - I4_NR * ob : I4_NR);
}
#endif
