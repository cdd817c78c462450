/* One decoder layer of a decode step on the CPU (fp32), in one call: with one to sixteen sequences a layer is four
   small matrix products and a handful of small ops, and calling each from Python cost about as much as the small
   ops themselves. This runs the same kernels in the same order (so the same numbers) as the Python path of
   decoder.py with decode_ops: norm, qkv, RoPE + K/V write, paged attention in place, o, add + norm, gate_up,
   SiLU-and-multiply, down, add, in one thread team. Built by decode_layer.py. */
#include "gemv.c"
#include "paged_decode.c"
#include "decode_ops.c"

typedef struct {  /* a layer's weights (dense [out, in]) and shape; set once per layer by decode_layer.py */
    const float *input_norm, *post_norm, *q_norm, *k_norm;  /* q_norm and k_norm NULL where the family has none */
    const float *qkv, *qkv_bias, *o, *o_bias, *gate_up, *down;  /* biases NULL where absent */
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    float eps, qk_eps, scale;
} Layer;

/* x [rows, hidden] is the residual stream, updated in place; scratch holds rows * Layer_scratch floats. */
void decode_layer_f32(const Layer *L, float *x, int64_t rows, const float *cos, const float *sin, float *k_cache,
                      float *v_cache, int64_t block_size, const int64_t *slots, const int64_t *tables,
                      int64_t table_width, const int64_t *lens, float *scratch, int threads) {
    const int64_t n = L->hidden, d = L->head_dim, width = (L->heads + 2 * L->kv_heads) * d;
    float *h = scratch, *qkv = h + rows * n, *attn = qkv + rows * width, *gu = attn + rows * L->heads * d;
    float *act = gu + rows * 2 * L->intermediate, *out = act + rows * L->intermediate;
#pragma omp parallel num_threads(threads)
    {  /* one team for the whole layer, each op's output complete (a barrier) before the next op reads it; OpenMP's
          barrier, which sleeps: a spinning one was faster on idle cores and up to 5x slower when other processes
          wanted them (bench/RESULTS.md, round 7) */
        rms_norm_team(x, 0, L->input_norm, h, rows, n, L->eps);
#pragma omp barrier
        gemv_team(h, L->qkv, L->qkv_bias, qkv, rows, width, n);
#pragma omp barrier
        rope_store_team(qkv, cos, sin, L->q_norm, L->k_norm, L->qk_eps, k_cache, v_cache, slots, rows, L->heads,
                        L->kv_heads, d);
#pragma omp barrier
        paged_decode_team(qkv, width, k_cache, v_cache, tables, table_width, lens, attn, rows, L->heads, L->kv_heads,
                          d, block_size, L->scale);
#pragma omp barrier
        gemv_team(attn, L->o, L->o_bias, out, rows, n, L->heads * d);
#pragma omp barrier
        rms_norm_team(x, out, L->post_norm, h, rows, n, L->eps);  /* x += attention, then its norm */
#pragma omp barrier
        gemv_team(h, L->gate_up, 0, gu, rows, 2 * L->intermediate, n);
#pragma omp barrier
        silu_mul_team(gu, act, rows, L->intermediate);
#pragma omp barrier
        gemv_team(act, L->down, 0, out, rows, n, L->intermediate);
#pragma omp barrier
#pragma omp for
        for (int64_t i = 0; i < rows * n; i++) x[i] += out[i];
    }
}
