/* A bf16 engine's decode step on the CPU in one call and one thread team: decode_layer.c over bf16_weights.h's
   tiles and a bf16 pool (each K/V row rounded to bf16 as it is written, widened as it is read), the arithmetic in
   between in fp32; the logits are computed after the call (the lm_head stays PyTorch's bf16 linear). Built by
   decode_layer.py. */
#define KV_BF16
#include "bf16_weights.h"
#define DECODE_LAYERS decode_layers_bf16
#include "decode_layer.c"
