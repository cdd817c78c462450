/* Decode products with int8 weights (quantization="int8"): y[m, o] = scale[o] * (x[m, :] . q[o, :]) + bias[o] for a
   few fp32 rows x, q int8 [out, in] with one scale per weight row. gemv.c's tiles and threads, each weight vector
   read as VW bytes and widened to floats in registers, so a token reads one byte a weight; a thread scales its own
   block of y as it finishes it. Hand-written because PyTorch's weight-only int8 kernel (and fbgemm's dynamic one)
   read 12-22 GB/s in a decode step of the 348M bench model where llama.cpp's Q8_0 read 20 (bench/RESULTS.md,
   session 17); the engine times both at load and keeps the faster (calibrate.py). Built by gemv_int8.py. */
#include "simd.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* VW int8 weights widened to a vector of floats: one sign-extending load and one conversion (GCC turns the generic
   vector conversion into a byte at a time, 4x slower than PyTorch's kernel, so x86 spells the two instructions). */
static inline vec load_int8(const int8_t *p) {
#if VW == 16 && defined(__AVX512F__)
    return (vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif VW == 8 && defined(__AVX2__)
    return (vec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    typedef int8_t bvec __attribute__((vector_size(VW)));
    bvec b;
    __builtin_memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, vec);
#endif
}
#define GEMV_INT8
#define GEMV_W int8_t
#define GEMV_LOAD(p) load_int8(p)
#define PREFETCH_AHEAD 256  /* bytes: four cache lines ahead in the next weight rows */
#include "gemv.c"

void gemv_int8(const float *x, const int8_t *q, const float *scale, const float *bias, float *y, int64_t rows,
               int64_t out, int64_t in, int threads) {
    const int64_t blocks = (out + NR - 1) / NR;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t ob = 0; ob < blocks; ob++) {
        const int64_t o = NR * ob, n = out - o < NR ? out - o : NR;
        gemv_block(x, q, 0, y, rows, out, in, o, n);
        for (int64_t m = 0; m < rows; m++)
            for (int64_t b = o; b < o + n; b++) y[m * out + b] = y[m * out + b] * scale[b] + (bias ? bias[b] : 0.f);
    }
}
