/* Decode products with int4 weights (quantization="int4"), one a call: int4_weights.h's tiles over a thread team.
   The engine runs them inside decode_layer_int4.c's one-call step; this entry serves the tests and
   bench.quantized_linears (GB/s of int4 bytes against PyTorch's int4 kernel). Built by gemv_int4.py. */
#include "int4_weights.h"

void gemv_int4(const float *x, const uint8_t *q, const float *sm, int64_t group, const float *bias, float *y,
               int64_t rows, int64_t out, int64_t in, int threads) {
    const Int4W w = {q, sm, group};
#pragma omp parallel num_threads(threads)
    gemv_team(x, &w, 0, bias, y, rows, out, in);
}

/* *out: 2 where the integer dot is AVX-512 VNNI's, 1 AVX2's, 0 the portable loop. */
void int4_path(int *out) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(I4_NO_VNNI) && !defined(I4_PORTABLE)
    *out = 2;
#elif defined(__AVX2__) && !defined(I4_PORTABLE)
    *out = 1;
#else
    *out = 0;
#endif
}
