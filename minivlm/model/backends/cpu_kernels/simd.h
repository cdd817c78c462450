/* What the CPU kernels share about vectors: the width (16 floats where the compiler targets AVX-512, else 8;
   GCC/Clang vector extensions, so the same code is SIMD on x86 and ARM), a lane sum, and a way to pin a value in a
   register. Included by gemv.c and paged_decode.c (and so by decode_layer.c, which includes both). */
#ifndef MINIVLM_SIMD_H
#define MINIVLM_SIMD_H
#include <stdint.h>

#if defined(__AVX512F__) && !defined(GEMV_NO_512)
#define VW 16  /* floats a vector */
#else
#define VW 8
#endif
typedef float vec __attribute__((vector_size(VW * 4), aligned(4)));  /* any alignment: rows are not aligned */
typedef int32_t ivec __attribute__((vector_size(VW * 4), aligned(4)));
typedef float vec4 __attribute__((vector_size(16), aligned(4)));

/* The sum of a vector's lanes, pairwise: lanes i and i + w for w = VW/2 .. 1, the same tree for any width. Written
   as quarters added (the compiler's lane extracts), not a loop over lanes, which compiles to stores and reloads
   through the stack: that had cost more than a gemv tile's multiply-adds at 768 columns (RESULTS.md, round 10). */
static inline float hsum(vec s) {
    vec4 q[VW / 4];
    __builtin_memcpy(q, &s, sizeof s);
    for (int w = VW / 8; w > 0; w /= 2)
        for (int i = 0; i < w; i++) q[i] += q[i + w];
    return (q[0][0] + q[0][2]) + (q[0][1] + q[0][3]);
}

/* Keeps a value in a register as computed: GCC otherwise folds a loaded vector into each multiply-add that uses it
   (gemv.c), and the build's reassociation merges two steps written apart on purpose (paged_decode.c). x86 with AVX
   only; elsewhere nothing. */
#if defined(__AVX__)
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define IN_REGISTER(v) (void)0
#endif

#endif
