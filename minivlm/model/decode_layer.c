/* One decoder layer of a decode step on the CPU (fp32), in one call: with one to sixteen sequences a layer is four
   small matrix products and a handful of small ops, and calling each from Python cost about as much as the small
   ops themselves. This runs the same kernels in the same order (so the same numbers) as the Python path of
   decoder.py with decode_ops: norm, qkv, RoPE + K/V write, paged attention in place, o, add + norm, gate_up,
   SiLU-and-multiply, down, add, in one thread team. Built by decode_layer.py. */
#include "gemv.c"
#include "paged_decode.c"
#include "decode_ops.c"
#include <omp.h>
#include <sched.h>

/* The team waits here between two ops. It spins: OpenMP's own barrier soon puts a waiting thread to sleep (it
   counts a pool of threads per calling thread, more than the cores, so it spins little), and waking one took
   10-80 us here, 64 times a step when every op started a team of its own (bench/RESULTS.md, round 7). */
typedef struct { int arrived, phase; } Barrier;

static void barrier_wait(Barrier *b) {
    const int n = omp_get_num_threads(), phase = __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == n) {  /* the last one in lets everyone go */
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->phase, phase + 1, __ATOMIC_RELEASE);
        return;
    }
    for (long spins = 0; __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE) == phase; spins++) {
        if (spins > 20000) {
            sched_yield();  /* the other thread lost its core: give it ours */
        } else {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ volatile("yield");
#endif
        }
    }
}

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
    Barrier bar = {0, 0};
#pragma omp parallel num_threads(threads)
    {  /* one team for the whole layer, each op's output complete (a barrier) before the next op reads it */
        rms_norm_team(x, 0, L->input_norm, h, rows, n, L->eps);
        barrier_wait(&bar);
        gemv_team(h, L->qkv, L->qkv_bias, qkv, rows, width, n);
        barrier_wait(&bar);
        rope_store_team(qkv, cos, sin, L->q_norm, L->k_norm, L->qk_eps, k_cache, v_cache, slots, rows, L->heads,
                        L->kv_heads, d);
        barrier_wait(&bar);
        paged_decode_team(qkv, width, k_cache, v_cache, tables, table_width, lens, attn, rows, L->heads, L->kv_heads,
                          d, block_size, L->scale);
        barrier_wait(&bar);
        gemv_team(attn, L->o, L->o_bias, out, rows, n, L->heads * d);
        barrier_wait(&bar);
        rms_norm_team(x, out, L->post_norm, h, rows, n, L->eps);  /* x += attention, then its norm */
        barrier_wait(&bar);
        gemv_team(h, L->gate_up, 0, gu, rows, 2 * L->intermediate, n);
        barrier_wait(&bar);
        silu_mul_team(gu, act, rows, L->intermediate);
        barrier_wait(&bar);
        gemv_team(act, L->down, 0, out, rows, n, L->intermediate);
        barrier_wait(&bar);
#pragma omp for
        for (int64_t i = 0; i < rows * n; i++) x[i] += out[i];
    }
}
