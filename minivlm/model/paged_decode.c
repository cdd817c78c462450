/* Decode attention straight from the paged KV pool (fp32, CPU): each (sequence, KV head) walks its block table
   and keeps an online softmax (running max, sum, weighted V) per query head of its group, so every K/V byte of the
   context is read once, in place, and no copy of the context is ever made. Built by paged_cpu.py. */
#include <math.h>
#include <stdint.h>

/* e^x for x <= 0 (a score minus its running max), in a form the compiler vectorises (expf is a library call it
   does not): 2^n * e^r with r in [-ln2/2, ln2/2] and e^r to the r^7 term, within 1 ulp of e^x. Below -40 it is 0:
   such a weight (under 4e-18, beside the max's 1) cannot move the float sums, and tiny weights times V would make
   subnormal products, which cost a microcode assist each. */
static inline float exp_nonpositive(float x) {
    const float y = x < -40.f ? -40.f : x;
    const float n = floorf(y * 1.44269504f + 0.5f);
    const float r = (y - n * 0.693145752f) - n * 1.42860677e-6f;  /* ln 2 in two parts: r stays exact */
    float p = 1.f / 5040;
    p = p * r + 1.f / 720;
    p = p * r + 1.f / 120;
    p = p * r + 1.f / 24;
    p = p * r + 1.f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    return x < -40.f ? 0.f : p * two_n.f;
}

/* A thread's share, inside a team already running (decode_layer.c's); no barrier at the end: the caller waits.
   Per block, each K row and each V row is read once for the whole query-head group (scores, then weights, then the
   weighted V), and the softmax weights of a block are computed as one vectorised loop per head. */
static void paged_decode_team(const float *q, int64_t q_row_stride, const float *k_cache, const float *v_cache,
                              const int64_t *tables, int64_t table_width, const int64_t *lens, float *out,
                              int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size,
                              float scale) {
    const int64_t group = heads / kv_heads, token_stride = kv_heads * head_dim;
#pragma omp for collapse(2) schedule(dynamic) nowait
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t kh = 0; kh < kv_heads; kh++) {
            float m[group], l[group], acc[group * head_dim], s[group * block_size];  /* s: the block's scores */
            const float *qb = q + b * q_row_stride + kh * group * head_dim;  /* the group's query heads */
            for (int64_t g = 0; g < group; g++) {
                m[g] = -INFINITY;
                l[g] = 0.f;
                for (int64_t d = 0; d < head_dim; d++) acc[g * head_dim + d] = 0.f;
            }
            const int64_t len = lens[b];
            for (int64_t j = 0; j * block_size < len; j++) {
                const int64_t n = len - j * block_size < block_size ? len - j * block_size : block_size;
                const int64_t base = tables[b * table_width + j] * block_size * token_stride + kh * head_dim;
                const float *kb = k_cache + base, *vb = v_cache + base;
                for (int64_t t = 0; t < n; t++) {
                    const float *kt = kb + t * token_stride;
                    for (int64_t g = 0; g < group; g++) {
                        const float *qg = qb + g * head_dim;
                        float dot = 0.f;
                        for (int64_t d = 0; d < head_dim; d++) dot += qg[d] * kt[d];
                        s[g * block_size + t] = dot * scale;
                    }
                }
                for (int64_t g = 0; g < group; g++) {
                    float *sg = s + g * block_size, mx = m[g], sum = 0.f;
                    for (int64_t t = 0; t < n; t++) mx = sg[t] > mx ? sg[t] : mx;
                    const float corr = expf(m[g] - mx);  /* rescale what was summed under the old max */
                    for (int64_t d = 0; d < head_dim; d++) acc[g * head_dim + d] *= corr;
                    for (int64_t t = 0; t < n; t++) {
                        sg[t] = exp_nonpositive(sg[t] - mx);
                        sum += sg[t];
                    }
                    l[g] = l[g] * corr + sum;
                    m[g] = mx;
                }
                for (int64_t t = 0; t < n; t++) {
                    const float *vt = vb + t * token_stride;
                    for (int64_t g = 0; g < group; g++) {
                        const float p = s[g * block_size + t];
                        float *ag = acc + g * head_dim;
                        for (int64_t d = 0; d < head_dim; d++) ag[d] += p * vt[d];
                    }
                }
            }
            float *ob = out + (b * heads + kh * group) * head_dim;
            for (int64_t i = 0; i < group * head_dim; i++) ob[i] = acc[i] / l[i / head_dim];
        }
    }
}

void paged_decode_f32(const float *q, int64_t q_row_stride, const float *k_cache, const float *v_cache,
                      const int64_t *tables, int64_t table_width, const int64_t *lens, float *out,
                      int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size,
                      float scale, int threads) {
#pragma omp parallel num_threads(threads)
    paged_decode_team(q, q_row_stride, k_cache, v_cache, tables, table_width, lens, out, batch, heads, kv_heads,
                      head_dim, block_size, scale);
}
