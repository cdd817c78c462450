/* A decode step's decoder layers, final norm and logits on the CPU (fp32), in one call and one thread team: with one
   to sixteen sequences a layer is four small matrix products and a handful of small ops, and calling each from Python
   cost about as much as the small ops themselves. This runs the same kernels (so the same numbers) as the Python
   path (fused_layer in __init__.py, with decode_ops): norm, qkv, RoPE + K/V write, paged attention in place, o,
   add + norm, gate_up, SiLU-and-multiply, down, add. Built by decode_layer.py.

   The team waits only where a matrix product's output, split between the threads, is read whole: five barriers a
   layer. Every thread keeps its own copy of the residual stream and its norm (rows x hidden floats: each thread
   does the same arithmetic, so the copies stay equal bit for bit), which saves the barriers around the adds and
   norms; a thread ropes, stores and attends for its (sequence, KV head) pairs without waiting in between. */
#ifdef _OPENMP
#include <omp.h>
#else  /* built without OpenMP (c_build.py: Apple clang): a team of one, the same arithmetic */
#define omp_get_num_threads() 1
#define omp_get_thread_num() 0
#endif
#ifndef DECODE_LAYERS  /* decode_layer_int8.c / _int4.c / _bf16.c include this file with other weights */
#define DECODE_LAYERS decode_layers_f32
#endif
#include "team_barrier.c"
#ifndef GEMV_INT4  /* int4_weights.h brings its own gemv_team */
#include "gemv.c"
#endif
#include "paged_decode.c"
#include "decode_ops.c"

typedef struct {  /* a layer's weights (dense [out, in]) and shape; set once per layer by decode_layer.py */
    const float *input_norm, *post_norm, *q_norm, *k_norm;  /* q_norm and k_norm NULL where the family has none */
    const GEMV_W *qkv;
    const float *qkv_bias;
    const GEMV_W *o;
    const float *o_bias;  /* biases NULL where absent */
    const GEMV_W *gate_up, *down;
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    float eps, qk_eps, scale;
    const float *qkv_scale, *o_scale, *gate_up_scale, *down_scale;  /* int8 weights' per-row scales; NULL for fp32 */
} Layer;

/* x += delta (rows x n), then out = its norm: every thread on its own copy, so nobody waits. */
static inline void add_norm_rows(float *x, const float *delta, const float *w, float *out, int64_t rows, int64_t n,
                                 float eps) {
    for (int64_t t = 0; t < rows; t++) {
        if (delta)
            for (int64_t i = 0; i < n; i++) x[t * n + i] += delta[t * n + i];
        norm_row(out + t * n, x + t * n, w, n, eps);
    }
}

/* RoPE, the K/V write and attention for every (sequence, KV head), a sequence's new tokens in order (seq_ends:
   where each sequence's rows end). A token attends only to its own sequence's K/V up to itself, which this thread
   wrote just before (or an earlier step did): no wait between the write and the attention. */
static void attention_team(const Layer *L, float *qkv, int64_t width, const float *cos, const float *sin,
                           kv_t *k_cache, kv_t *v_cache, const int64_t *slots, const int64_t *tables,
                           int64_t table_width, const int64_t *lens, float *attn, const int64_t *seq_ends,
                           int64_t seqs, int64_t block_size) {
    const int64_t d = L->head_dim, kvh = L->kv_heads, group = L->heads / kvh;
#pragma omp for collapse(2) schedule(dynamic) nowait
    for (int64_t s = 0; s < seqs; s++)
        for (int64_t kh = 0; kh < kvh; kh++)
            for (int64_t t = s ? seq_ends[s - 1] : 0; t < seq_ends[s]; t++) {
                rope_store_group(qkv + t * width, cos + t * d, sin + t * d, L->q_norm, L->k_norm, L->qk_eps, k_cache,
                                 v_cache, slots[t], L->heads, kvh, d, kh);
                attend_group(qkv + t * width + kh * group * d, k_cache, v_cache, tables + t * table_width, lens[t],
                             attn + (t * L->heads + kh * group) * d, group, kh, kvh, d, block_size, L->scale);
            }
}

/* gate_up's rows j and intermediate + j computed by the same thread, so SiLU(gate) * up follows at once. */
static void gate_up_silu_team(const float *h, const GEMV_W *w, const float *scale, float *gu, float *act,
                              int64_t rows, int64_t inter, int64_t n) {
#if defined(GEMV_INT4)  /* int4 weights: h quantized once for both halves (int4_weights.h) */
    const I4X hq = i4_quantize(h, rows, n);
    const int64_t B = I4_NR;
#define GATE_UP_BLOCK(o, cnt) i4_block(hq, w, 0, gu, rows, 2 * inter, n, o, cnt)
    (void)scale;
#elif defined(GEMV_Q8_X)  /* int8 weights: int8 h (q8_activations.h), blocks of Q8_NR */
    const int q8 = n % Q8_BLOCK == 0;
    const Q8X hq = q8 ? q8_quantize(h, rows, n) : (Q8X){0, 0};
    const int64_t B = q8 ? Q8_NR : block_rows(rows);
#define GATE_UP_BLOCK(o, cnt) (q8 ? q8_block(hq, w, scale, 0, gu, rows, 2 * inter, n, o, cnt) \
                                  : gemv_block(h, w, scale, 0, gu, rows, 2 * inter, n, o, cnt))
#else
    const int64_t B = block_rows(rows);
#define GATE_UP_BLOCK(o, cnt) gemv_block(h, w, scale, 0, gu, rows, 2 * inter, n, o, cnt)
#endif
    const int64_t blocks = (inter + B - 1) / B;
#pragma omp for schedule(static) nowait
    for (int64_t ob = 0; ob < blocks; ob++) {
        const int64_t o = B * ob, cnt = inter - o < B ? inter - o : B;
        GATE_UP_BLOCK(o, cnt);
        GATE_UP_BLOCK(inter + o, cnt);
        for (int64_t t = 0; t < rows; t++) {
            const float *g = gu + t * 2 * inter + o, *u = g + inter;
            for (int64_t i = 0; i < cnt; i++) act[t * inter + o + i] = g[i] / (1.f + expf(-g[i])) * u[i];
        }
    }
#undef GATE_UP_BLOCK
}

/* x [rows, hidden]: the step's embeddings in, the final norm of the last layer's output out (in place).
   k_caches / v_caches: each layer's pool; tables / lens: each row's (a chunk's tokens each have their own).
   lm_head [vocab, hidden] (+ bias, or NULL): logits [n_last, vocab] of the rows `last` (each sequence's last token)
   in the same team, which saves waking it once more for them; NULL: no logits. */
void DECODE_LAYERS(const Layer *layers, int64_t n_layers, float *x, int64_t rows, const float *cos,
                       const float *sin, kv_t *const *k_caches, kv_t *const *v_caches, int64_t block_size,
                       const int64_t *slots, const int64_t *tables, int64_t table_width, const int64_t *lens,
                       const int64_t *seq_ends, int64_t seqs, const float *final_norm, float final_eps,
                       const float *lm_head, const float *lm_bias, int64_t vocab, const int64_t *last,
                       int64_t n_last, float *logits, float *scratch, int threads) {
    const Layer *L0 = layers;  /* every layer has the same shape */
    const int64_t n = L0->hidden, width = (L0->heads + 2 * L0->kv_heads) * L0->head_dim, inter = L0->intermediate;
    float *qkv = scratch, *attn = qkv + rows * width, *gu = attn + rows * L0->heads * L0->head_dim;
    float *act = gu + rows * 2 * inter, *o_out = act + rows * inter, *down_out = o_out + rows * n;
    float *mine = down_out + rows * n;  /* per thread: the residual stream, then its norm (DecodeStep.scratch_floats) */
    TeamBarrier barrier = {0, 0, 0};
#pragma omp parallel num_threads(threads)
    {
        const int team = omp_get_num_threads();
        int sense = 0;
#define WAIT() team_wait(&barrier, &sense, team)
        float *xs = mine + omp_get_thread_num() * 2 * rows * n, *h = xs + rows * n;
        memcpy(xs, x, rows * n * sizeof(float));
        add_norm_rows(xs, 0, L0->input_norm, h, rows, n, L0->eps);
        for (int64_t l = 0; l < n_layers; l++) {
            const Layer *L = layers + l;
            gemv_team(h, L->qkv, L->qkv_scale, L->qkv_bias, qkv, rows, width, n);
            WAIT();
            attention_team(L, qkv, width, cos, sin, k_caches[l], v_caches[l], slots, tables, table_width, lens, attn,
                           seq_ends, seqs, block_size);
            WAIT();
            gemv_team(attn, L->o, L->o_scale, L->o_bias, o_out, rows, n, L->heads * L->head_dim);
            WAIT();
            add_norm_rows(xs, o_out, L->post_norm, h, rows, n, L->eps);  /* x += attention, then its norm */
            gate_up_silu_team(h, L->gate_up, L->gate_up_scale, gu, act, rows, inter, n);
            WAIT();
            gemv_team(act, L->down, L->down_scale, 0, down_out, rows, n, inter);
            WAIT();
            const int last = l + 1 == n_layers;  /* x += mlp, then the next layer's input norm or the final one */
            add_norm_rows(xs, down_out, last ? final_norm : layers[l + 1].input_norm, h, rows, n,
                          last ? final_eps : layers[l + 1].eps);
        }
#ifdef GEMV_F32  /* int8 or bf16 layers: the lm_head runs after the call, in PyTorch */
        if (lm_head) {  /* each thread gathers the last rows into its own buffer (the residual's, free now) */
            for (int64_t i = 0; i < n_last; i++) memcpy(xs + i * n, h + last[i] * n, n * sizeof(float));
            gemv_team(xs, lm_head, 0, lm_bias, logits, n_last, vocab, n);
        }
#endif
        if (omp_get_thread_num() == 0) memcpy(x, h, rows * n * sizeof(float));
    }
}
