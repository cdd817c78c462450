/* bf16 weights for gemv.c's tiles (a bf16 engine's decode step on the CPU): each weight vector read as VW bf16
   values and widened to floats in registers, so a step reads two bytes a weight (half of fp32's) and multiplies in
   fp32, as llama.cpp's F16 type does on a CPU without native bf16 or f16 arithmetic. Included, before gemv.c, by
   decode_layer_bf16.c. */
#include "bf16.h"
#define GEMV_BF16
#define GEMV_W uint16_t
#define GEMV_LOAD(p) load_bf16(p)
#define GEMV_AT(p) bf16_to_f32(*(p))
