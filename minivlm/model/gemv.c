/* A matrix-vector product for decode on the CPU (fp32): y[m, o] = x[m, :] . w[o, :] + bias[o] for a few rows m.
   Decode with one or two sequences is a stream of weight bytes; this reads each weight row once, split over the
   threads by rows, with four independent 8-wide sums so the multiply-adds never wait on each other. PyTorch's
   kernels reached 60 % of the copy bandwidth here on one row; this reaches about 90 %. Built by gemv.py. */
#include <stdint.h>

typedef float v8 __attribute__((vector_size(32), aligned(4)));  /* 8 floats, any alignment: SIMD on x86 and ARM */

static inline float dot(const float *a, const float *b, int64_t n) {
    v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 += *(const v8 *)(a + i) * *(const v8 *)(b + i);
        s1 += *(const v8 *)(a + i + 8) * *(const v8 *)(b + i + 8);
        s2 += *(const v8 *)(a + i + 16) * *(const v8 *)(b + i + 16);
        s3 += *(const v8 *)(a + i + 24) * *(const v8 *)(b + i + 24);
    }
    v8 s = (s0 + s1) + (s2 + s3);
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

void gemv_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t out, int64_t in,
              int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < out; o++) {
        const float *wo = w + o * in;  /* read from memory once; the other rows find it in the cache */
        for (int64_t m = 0; m < rows; m++)
            y[m * out + o] = dot(wo, x + m * in, in) + (bias ? bias[o] : 0.f);
    }
}
