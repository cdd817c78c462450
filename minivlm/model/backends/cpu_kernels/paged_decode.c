/* Decode attention straight from the paged KV pool (CPU; fp32, or bf16 widened as read: kv_t): each (sequence, KV
   head) walks its block table and keeps an online softmax (running max, sum, weighted V) per query head of its group,
   so every K/V byte of the context is read once, in place, and no copy of the context is ever made. A block at a
   time: each K row is loaded once for the group's scores, the exponentials run a vector of scores at a time (vexp
   below, not one libm call a score), and each V row once for the group's sums. Built by paged_cpu.py. */
#include <math.h>
#include "simd.h"
#include "bf16.h"  /* kv_t: the pool's element type (fp32; bf16 in decode_layer_bf16.c) */

/* e^x for a vector: x = n ln2 + r with |r| <= ln2/2, e^r by Cephes' degree-6 polynomial (about 1 ulp), 2^n put in
   the exponent bits. Lanes below -87.3 give 0 (what a masked score's weight must be), above 88.3 +inf. */
static inline vec vexp(vec x) {
    const vec zero = {0};
    const ivec under = x < -87.3f, over = x > 88.3f;  /* lane-wise compares: all ones or 0 */
    x = (vec)(((ivec)x & ~(under | over)) | ((ivec)(zero - 87.3f) & under) | ((ivec)(zero + 88.3f) & over));
    const vec t = x * 1.44269504088896341f + 12582912.0f;  /* 1.5 x 2^23: the sum's low bits hold round(x log2 e) */
    const ivec ni = (ivec)t - 0x4B400000;  /* that integer (t - 1.5 x 2^23 in floats: reassociated away) */
    const vec n = __builtin_convertvector(ni, vec);
    vec r = x - n * 0.693359375f;  /* ln 2 in two parts, so r keeps its low bits */
    IN_REGISTER(r);  /* not merged back with the next step */
    r = r - n * -2.12194440e-4f;
    vec p = zero + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const ivec pow2n = (ni + 127) << 23;  /* 2^n: n, biased, in the exponent field */
    const ivec y = (ivec)(p * (vec)pow2n);
    return (vec)((y & ~(under | over)) | ((ivec)(zero + INFINITY) & over));
}

/* One sequence's query heads of one KV head group (q [group, head_dim] -> out [group, head_dim]) over its `len`
   tokens, read through its block table. */
static inline __attribute__((always_inline)) void attend_group_any(
        const float *q, const kv_t *k_cache, const kv_t *v_cache, const int64_t *table, int64_t len, float *out,
        int64_t group, int64_t kh, int64_t kv_heads, int64_t head_dim, int64_t block_size, float scale) {
    const int64_t token_stride = kv_heads * head_dim, dv = head_dim - head_dim % VW;  /* [0, dv): whole vectors */
    const int64_t sw = (block_size + VW - 1) / VW * VW;  /* a score row, padded to whole vectors */
    float m[group], l[group], acc[group * head_dim], s[group * sw];
    for (int64_t g = 0; g < group; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
        for (int64_t d = 0; d < head_dim; d++) acc[g * head_dim + d] = 0.f;
    }
    for (int64_t j = 0; j * block_size < len; j++) {
        const int64_t n = len - j * block_size < block_size ? len - j * block_size : block_size;
        const int64_t base = table[j] * block_size * token_stride + kh * head_dim;
        const kv_t *kb = k_cache + base, *vb = v_cache + base;
        for (int64_t t = 0; t < n; t++) {  /* scores: each K row read once, for every query head of the group */
            const kv_t *kt = kb + t * token_stride;
            for (int64_t g = 0; g < group; g++) {
                const float *qg = q + g * head_dim;
                vec sum = {0};
                for (int64_t d = 0; d < dv; d += VW)
                    sum += *(const vec *)(qg + d) * KV_VEC(kt + d);
                float dot = hsum(sum);
                for (int64_t d = dv; d < head_dim; d++) dot += qg[d] * KV_AT(kt + d);
                s[g * sw + t] = dot * scale;
            }
        }
        for (int64_t g = 0; g < group; g++) {  /* online softmax: the new max, the old sums rescaled, weights */
            float *sg = s + g * sw, mx = m[g];
            for (int64_t t = 0; t < n; t++) mx = sg[t] > mx ? sg[t] : mx;
            for (int64_t t = n; t < sw; t++) sg[t] = -INFINITY;  /* padding lanes weigh 0 */
            const float corr = expf(m[g] - mx);
            float sum = 0.f;
            for (int64_t t = 0; t < sw; t += VW) {
                const vec p = vexp(*(vec *)(sg + t) - mx);
                *(vec *)(sg + t) = p;
                sum += hsum(p);
            }
            l[g] = l[g] * corr + sum;
            for (int64_t d = 0; d < head_dim; d++) acc[g * head_dim + d] *= corr;
            m[g] = mx;
        }
        for (int64_t t = 0; t < n; t++) {  /* weighted V: each V row read once, for every query head */
            const kv_t *vt = vb + t * token_stride;
            for (int64_t g = 0; g < group; g++) {
                const float p = s[g * sw + t];
                float *ag = acc + g * head_dim;
                for (int64_t d = 0; d < dv; d += VW)
                    *(vec *)(ag + d) += p * KV_VEC(vt + d);
                for (int64_t d = dv; d < head_dim; d++) ag[d] += p * KV_AT(vt + d);
            }
        }
    }
    for (int64_t i = 0; i < group * head_dim; i++) out[i] = acc[i] / l[i / head_dim];
}

/* attend_group_any with the usual head sizes as constants: the compiler unrolls the head's vectors and keeps them in
   registers (about half the time of a runtime size; RESULTS.md, round 10). */
static inline void attend_group(const float *q, const kv_t *k_cache, const kv_t *v_cache, const int64_t *table,
                                int64_t len, float *out, int64_t group, int64_t kh, int64_t kv_heads,
                                int64_t head_dim, int64_t block_size, float scale) {
    if (head_dim == 64)
        attend_group_any(q, k_cache, v_cache, table, len, out, group, kh, kv_heads, 64, block_size, scale);
    else if (head_dim == 128)
        attend_group_any(q, k_cache, v_cache, table, len, out, group, kh, kv_heads, 128, block_size, scale);
    else
        attend_group_any(q, k_cache, v_cache, table, len, out, group, kh, kv_heads, head_dim, block_size, scale);
}

#ifndef KV_BF16  /* the fp32 pool's entry point (paged_cpu.py) */
void paged_decode_f32(const float *q, int64_t q_row_stride, const float *k_cache, const float *v_cache,
                      const int64_t *tables, int64_t table_width, const int64_t *lens, float *out,
                      int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size,
                      float scale, int threads) {
    const int64_t group = heads / kv_heads;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t kh = 0; kh < kv_heads; kh++)
            attend_group(q + b * q_row_stride + kh * group * head_dim, k_cache, v_cache, tables + b * table_width,
                         lens[b], out + (b * heads + kh * group) * head_dim, group, kh, kv_heads, head_dim,
                         block_size, scale);
}
#endif
