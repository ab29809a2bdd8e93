#version 450
// matmul_subgroup.comp for one token (decode): the same arithmetic per token, without the idle
// accumulators.
#extension GL_KHR_shader_subgroup_arithmetic : require
#define SUBGROUPS 1
#define MATMUL_TOKENS 1u
#include "matmul.glsl"
