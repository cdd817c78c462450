/* int8 weights for gemv.c's tiles (quantization="int8"): each weight vector read as VW bytes and widened to floats
   in registers, so a decode step reads one byte a weight, and a scale per weight row applied with the bias.
   Included, before gemv.c, by gemv_int8.c (one product a call) and decode_layer_int8.c (a whole step a call). */
#include "simd.h"
#include "q8_activations.h"
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
