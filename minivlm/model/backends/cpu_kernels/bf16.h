/* bf16 numbers as the CPU kernels read and write them: a bf16 is the top half of an fp32, so widening is a shift,
   and narrowing rounds to nearest even as PyTorch's .to(torch.bfloat16) does. Also the pool's element type, kv_t:
   fp32, or bf16 where the including file defines KV_BF16 (decode_layer_bf16.c: a bf16 engine's pool). Included by
   paged_decode.c, decode_ops.c and bf16_weights.h. */
#ifndef MINIVLM_BF16_H
#define MINIVLM_BF16_H
#include <stdint.h>
#include <string.h>
#include "simd.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static inline float bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even; every NaN the one quiet NaN, as PyTorch */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* VW bf16 values widened to a vector of floats: zero-extend each to 32 bits, shift into the top half. */
static inline vec load_bf16(const uint16_t *p) {
#if VW == 16 && defined(__AVX512F__)
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return (vec)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif VW == 8 && defined(__AVX2__)
    return (vec)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
#else
    typedef uint16_t hvec __attribute__((vector_size(VW * 2)));
    hvec h;
    __builtin_memcpy(&h, p, sizeof h);
    return (vec)(__builtin_convertvector(h, ivec) << 16);
#endif
}

#ifdef KV_BF16
typedef uint16_t kv_t;
#define KV_VEC(p) load_bf16(p)
#define KV_AT(p) bf16_to_f32(*(p))
static inline void kv_store(kv_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}
#else
typedef float kv_t;
#define KV_VEC(p) (*(const vec *)(p))
#define KV_AT(p) (*(p))
static inline void kv_store(kv_t *dst, const float *src, int64_t n) { memcpy(dst, src, n * sizeof(float)); }
#endif
#endif
