/* int8 weights in a bf16 engine (quantization="int8", dtype="bfloat16") on the CPU: decode_layer_int8.c's step over a
   bf16 pool (bf16.h's kv_t), as decode_layer_bf16.c reads it. Built by decode_layer.py. */
#define KV_BF16
#include "int8_weights.h"
#define DECODE_LAYERS decode_layers_int8_bf16
#include "decode_layer.c"
