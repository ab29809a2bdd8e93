#version 450
// matmul.glsl reducing through subgroup operations (devices with subgroup arithmetic in compute
// shaders); matmul.comp's shared-memory tree is the portable fallback.
#extension GL_KHR_shader_subgroup_arithmetic : require
#define SUBGROUPS 1
#include "matmul.glsl"
