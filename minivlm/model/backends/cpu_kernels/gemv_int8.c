/* Decode products with int8 weights (quantization="int8"): y[m, o] = scale[o] * (x[m, :] . q[o, :]) + bias[o] for a
   few fp32 rows x, q int8 [out, in] with one scale per weight row: gemv.c's tiles and threads over int8 weights
   (int8_weights.h). Hand-written because PyTorch's weight-only int8 kernel (and fbgemm's dynamic one) read 12-22
   GB/s in a decode step of the 348M bench model where llama.cpp's Q8_0 read 20 (bench/RESULTS.md, session 17); the
   engine times both at load and keeps the faster (calibrate.py). Built by gemv_int8.py. */
#include "int8_weights.h"
#include "gemv.c"

void gemv_int8(const float *x, const int8_t *q, const float *scale, const float *bias, float *y, int64_t rows,
               int64_t out, int64_t in, int threads) {
#pragma omp parallel num_threads(threads)
    gemv_team(x, q, scale, bias, y, rows, out, in);
}

/* *out = 1 where products of inputs whose width is a multiple of 32 take int8 inputs (q8_activations.h), else 0. */
void q8_activations(int *out) {
#ifdef GEMV_Q8_X
    *out = 1;
#else
    *out = 0;
#endif
}
