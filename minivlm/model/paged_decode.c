/* Decode attention straight from the paged KV pool (fp32, CPU): each (sequence, KV head) walks its block table
   and keeps an online softmax (running max, sum, weighted V) per query head of its group, so every K/V byte of the
   context is read once, in place, and no copy of the context is ever made. Built by paged_cpu.py. */
#include <math.h>
#include <stdint.h>

/* One sequence's query heads of one KV head group (q [group, head_dim] -> out [group, head_dim]) over its `len`
   tokens, read through its block table. */
static inline void attend_group(const float *q, const float *k_cache, const float *v_cache, const int64_t *table,
                                int64_t len, float *out, int64_t group, int64_t kh, int64_t kv_heads,
                                int64_t head_dim, int64_t block_size, float scale) {
    const int64_t token_stride = kv_heads * head_dim;
    float m[group], l[group], acc[group * head_dim], s[block_size];
    for (int64_t g = 0; g < group; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
        for (int64_t d = 0; d < head_dim; d++) acc[g * head_dim + d] = 0.f;
    }
    for (int64_t j = 0; j * block_size < len; j++) {
        const int64_t n = len - j * block_size < block_size ? len - j * block_size : block_size;
        const int64_t base = table[j] * block_size * token_stride + kh * head_dim;
        const float *kb = k_cache + base, *vb = v_cache + base;
        for (int64_t g = 0; g < group; g++) {
            const float *qg = q + g * head_dim;
            float *ag = acc + g * head_dim, mx = m[g];
            for (int64_t t = 0; t < n; t++) {
                float dot = 0.f;
                for (int64_t d = 0; d < head_dim; d++) dot += qg[d] * kb[t * token_stride + d];
                s[t] = dot * scale;
                mx = s[t] > mx ? s[t] : mx;
            }
            const float corr = expf(m[g] - mx);  /* rescale what was summed under the old max */
            l[g] *= corr;
            for (int64_t d = 0; d < head_dim; d++) ag[d] *= corr;
            for (int64_t t = 0; t < n; t++) {
                const float p = expf(s[t] - mx);
                l[g] += p;
                for (int64_t d = 0; d < head_dim; d++) ag[d] += p * vb[t * token_stride + d];
            }
            m[g] = mx;
        }
    }
    for (int64_t i = 0; i < group * head_dim; i++) out[i] = acc[i] / l[i / head_dim];
}

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
