/* A decode step's decoder layers with int8 weights (quantization="int8") in one call and one thread team:
   decode_layer.c over int8_weights.h's tiles, each matrix with its per-row scales; the logits are computed after
   the call (the lm_head keeps its fp32 weight). Built by decode_layer.py. */
#include "int8_weights.h"
#define DECODE_LAYERS decode_layers_int8
#include "decode_layer.c"
