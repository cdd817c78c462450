/* int8 weights times int8 activations (quantization="int8", x86 with AVX2): a product's input rows quantized to int8
   in blocks of 32 (one fp32 scale a block, max |x| / 127, as llama.cpp's Q8_0), so 32 weights take one integer
   multiply-add chain (vpmaddubsw, vpmaddwd) and one float multiply-add, where widening each weight to a float took
   four of each: a single stream's int8 products were bound by that arithmetic, not by memory (two threads read 15
   GB/s of int8 weights where the same tiles read 28-30 GB/s of fp32 ones; bench/RESULTS.md, session 18).
   Included by int8_weights.h; gemv.c's team functions use it where the input width is a multiple of 32. */
#if defined(__AVX2__)
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#define GEMV_Q8_X
#define Q8_BLOCK 32
#ifndef Q8_NR
#define Q8_NR 6  /* weight rows a tile: 6 sums in flight, 16 registers */
#endif
#ifndef Q8_AHEAD
#define Q8_AHEAD 256  /* bytes ahead in the next tile's rows */
#endif
#ifndef Q8_STREAM
#define Q8_STREAM 12288  /* bytes ahead of the tile's progress, read as one stream: rows of 1,024 int8 (qkv, o,
                            gate_up) are too short for the next tile's prefetch alone (19 -> 23 GB/s; RESULTS.md) */
#endif

typedef struct {
    const int8_t *q;   /* [rows, in] */
    const float *s;    /* [rows, in / 32] */
} Q8X;

/* x's rows quantized into this thread's own buffer (each thread of a team makes its copy: a few thousand values, no
   barrier needed), reused by the next product. Every thread of the team must take the same path through the work
   that follows, so a buffer that cannot grow (a few hundred KB at most) ends the process with a message. */
static Q8X q8_quantize(const float *x, int64_t rows, int64_t in) {
    static __thread int8_t *buf;
    static __thread int64_t cap;
    const int64_t nb = in / Q8_BLOCK, need = rows * in + rows * nb * (int64_t)sizeof(float);
    if (need > cap) {
        int8_t *grown = realloc(buf, need);
        if (!grown) {
            fprintf(stderr, "minivlm q8_activations.h: out of memory for %lld bytes\n", (long long)need);
            abort();
        }
        buf = grown, cap = need;
    }
    int8_t *q = buf;
    float *s = (float *)(buf + rows * in);  /* rows * in is a multiple of 32: aligned for floats */
    const __m256 sign = _mm256_set1_ps(-0.f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  /* undoes the packs' lane interleave */
    for (int64_t i = 0; i < rows * nb; i++) {  /* a block: max |x|, then x * 127 / max rounded to nearest even */
        const float *xb = x + i * Q8_BLOCK;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        const float mx = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        s[i] = mx / 127.f;
        const __m256 inv = _mm256_set1_ps(mx > 0.f ? 127.f / mx : 0.f);
        __m256i n[4];
        for (int j = 0; j < 4; j++) n[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        _mm256_storeu_si256((__m256i *)(q + i * Q8_BLOCK), _mm256_permutevar8x32_epi32(p, order));
    }
    return (Q8X){q, s};
}

/* The 8 lanes' sum (simd.h's hsum takes the build's vector, 16 floats where it targets AVX-512). */
static inline float q8_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The 32 products of a block as 8 int32 sums: |x| times w with x's sign (vpmaddubsw multiplies unsigned by signed
   bytes; |x| <= 127 keeps each pair's sum within int16), pairs of pairs added by vpmaddwd. */
static inline __m256 q8_dot(__m256i ax, __m256i xv, const int8_t *w) {
    const __m256i wv = _mm256_loadu_si256((const __m256i *)w);
    const __m256i p16 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xv));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* y[b] = scale[b] * sum over blocks (s[blk] * x_blk . w[b]_blk) + bias[b] for one x row and N weight rows. */
#define Q8_TILE(N)                                                                                                \
    static inline void q8_tile_##N(const int8_t *xq, const float *xs, const int8_t *w, const float *scale,        \
                                   const float *bias, float *y, int64_t in) {                                    \
        __m256 acc[N];                                                                                            \
        for (int b = 0; b < N; b++) acc[b] = _mm256_setzero_ps();                                                 \
        for (int64_t k = 0, blk = 0; k < in; k += Q8_BLOCK, blk++) {                                              \
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + k));                                     \
            const __m256i ax = _mm256_sign_epi8(xv, xv);                                                          \
            const __m256 d = _mm256_broadcast_ss(xs + blk);                                                       \
            for (int b = 0; b < N; b++) {                                                                         \
                if (!(k & 63)) {  /* a cache line a row in the next tile's rows, one on the tile's stream */    \
                    __builtin_prefetch(w + (N + b) * in + k + Q8_AHEAD, 0, 0);                                    \
                    __builtin_prefetch(w + k * N + b * 64 + Q8_STREAM, 0, 0);                                     \
                }                                                                                                 \
                acc[b] = _mm256_fmadd_ps(q8_dot(ax, xv, w + b * in + k), d, acc[b]);                              \
            }                                                                                                     \
        }                                                                                                         \
        for (int b = 0; b < N; b++) y[b] = q8_hsum(acc[b]) * scale[b] + (bias ? bias[b] : 0.f);                 \
    }
#define Q8_TILE_OF(N) Q8_TILE_NAME(N)
#define Q8_TILE_NAME(N) q8_tile_##N
#define Q8_TILE_N(N) Q8_TILE(N)
Q8_TILE_N(Q8_NR) Q8_TILE(1)

/* Weight rows [o, o + n) against every quantized x row. */
static inline void q8_block(Q8X x, const int8_t *w, const float *scale, const float *bias, float *y, int64_t rows,
                            int64_t out, int64_t in, int64_t o, int64_t n) {
    const int64_t nb = in / Q8_BLOCK;
    for (int64_t m = 0; m < rows; m++) {
        const int8_t *xq = x.q + m * in;
        const float *xs = x.s + m * nb;
        if (n == Q8_NR) {
            Q8_TILE_OF(Q8_NR)(xq, xs, w + o * in, scale + o, bias ? bias + o : 0, y + m * out + o, in);
        } else {
            for (int64_t b = o; b < o + n; b++)
                q8_tile_1(xq, xs, w + b * in, scale + b, bias ? bias + b : 0, y + m * out + b, in);
        }
    }
}

/* gemv_team over int8 x where it applies (in a multiple of 32): 1, else 0 (the caller's fp32 x path runs). */
static inline int q8_team(const float *x, const int8_t *w, const float *scale, const float *bias, float *y,
                          int64_t rows, int64_t out, int64_t in) {
    if (in % Q8_BLOCK) return 0;
    const Q8X qx = q8_quantize(x, rows, in);
    const int64_t blocks = (out + Q8_NR - 1) / Q8_NR;
#pragma omp for schedule(static) nowait
    for (int64_t ob = 0; ob < blocks; ob++)
        q8_block(qx, w, scale, bias, y, rows, out, in, Q8_NR * ob, out - Q8_NR * ob < Q8_NR ? out - Q8_NR * ob : Q8_NR);
    return 1;
}
#endif
