/* The decoder layer's small ops for the CPU (fp32), fused: with one or a few tokens a step, each of them costs
   more in dispatch than in arithmetic. Three functions replace about 15 PyTorch ops per layer:
     rms_norm_f32       x += delta (the residual add, optional), then out = x * rsqrt(mean(x^2) + eps) * weight;
     rope_store_f32     per-head q/k RMSNorm (Qwen3, optional), RoPE on q and k in place, K and V into the pool;
     silu_mul_f32       out = silu(gate) * up, from the fused gate_up product.
   Same arithmetic as HF's fp32 modules, summed in another order (differences of a few ulps). Built by decode_ops.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "bf16.h"

#define PARALLEL_ROWS 16  /* below this many rows a thread team costs more than it saves */

static inline void norm_row(float *y, const float *x, const float *w, int64_t n, float eps) {
    float ss = 0.f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* One head v [d] in place: its RMSNorm (Qwen3's q_norm / k_norm; none where nw is NULL), then RoPE with one
   token's cos/sin [d] in rotate_half's layout. */
static inline void rope_head(float *v, const float *c, const float *s, const float *nw, float eps, int64_t d) {
    const int64_t half = d / 2;
    float x[d];
    if (nw) norm_row(x, v, nw, d, eps);
    else memcpy(x, v, d * sizeof(float));
    for (int64_t i = 0; i < half; i++) {  /* x * cos + rotate_half(x) * sin */
        v[i] = x[i] * c[i] - x[i + half] * s[i];
        v[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
    }
}

/* One token's row r [heads + 2 * kv_heads, d] (q heads, then k, then v), KV head kh: the group's query heads and
   its K head roped in place, its K and V into the pool at the token's slot. */
static inline void rope_store_group(float *r, const float *c, const float *s, const float *q_norm,
                                    const float *k_norm, float eps, kv_t *k_cache, kv_t *v_cache, int64_t slot,
                                    int64_t heads, int64_t kv_heads, int64_t d, int64_t kh) {
    const int64_t group = heads / kv_heads, at = (slot * kv_heads + kh) * d;
    for (int64_t g = kh * group; g < (kh + 1) * group; g++) rope_head(r + g * d, c, s, q_norm, eps, d);
    rope_head(r + (heads + kh) * d, c, s, k_norm, eps, d);
    kv_store(k_cache + at, r + (heads + kh) * d, d);
    kv_store(v_cache + at, r + (heads + kv_heads + kh) * d, d);
}

/* x += delta (optional, in place), then out = its norm; rows split over threads where there are enough. */
void rms_norm_f32(float *x, const float *delta, const float *w, float *out, int64_t rows, int64_t n, float eps,
                  int threads) {
#pragma omp parallel for if(rows >= PARALLEL_ROWS) num_threads(threads)
    for (int64_t t = 0; t < rows; t++) {
        float *xt = x + t * n;
        if (delta)
            for (int64_t i = 0; i < n; i++) xt[i] += delta[t * n + i];
        norm_row(out + t * n, xt, w, n, eps);
    }
}

#ifndef KV_BF16  /* the fp32 pool's entry point (decode_ops.py) */
/* qkv [rows, heads + 2 * kv_heads, d]; cos/sin [rows, d]; q_norm/k_norm [d] or NULL; caches [blocks * block_size,
   kv_heads, d]; slots [rows]: where each row's K/V go. */
void rope_store_f32(float *qkv, const float *cos, const float *sin, const float *q_norm, const float *k_norm,
                    float eps, float *k_cache, float *v_cache, const int64_t *slots, int64_t rows, int64_t heads,
                    int64_t kv_heads, int64_t d, int threads) {
#pragma omp parallel for if(rows >= PARALLEL_ROWS) num_threads(threads)
    for (int64_t t = 0; t < rows; t++)
        for (int64_t kh = 0; kh < kv_heads; kh++)
            rope_store_group(qkv + t * (heads + 2 * kv_heads) * d, cos + t * d, sin + t * d, q_norm, k_norm, eps,
                             k_cache, v_cache, slots[t], heads, kv_heads, d, kh);
}
#endif

void silu_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t n, int threads) {
#pragma omp parallel for if(rows >= PARALLEL_ROWS) num_threads(threads)
    for (int64_t t = 0; t < rows; t++) {
        const float *g = gate_up + t * 2 * n, *u = g + n;
        for (int64_t i = 0; i < n; i++) out[t * n + i] = g[i] / (1.f + expf(-g[i])) * u[i];
    }
}
