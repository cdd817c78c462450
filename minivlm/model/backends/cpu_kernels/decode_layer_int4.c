/* A decode step's decoder layers with int4 weights (quantization="int4") in one call and one thread team:
   decode_layer.c over int4_weights.h's products (nibbles x the rows quantized to int8 blocks); the logits are
   computed after the call (the int8 lm_head). Built by decode_layer.py. */
#include "int4_weights.h"
#define DECODE_LAYERS decode_layers_int4
#include "decode_layer.c"
