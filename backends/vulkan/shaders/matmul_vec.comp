#version 450
// matmul.comp for one token (decode): the same arithmetic per token, without the idle accumulators.
#define MATMUL_TOKENS 1u
#include "matmul.glsl"
