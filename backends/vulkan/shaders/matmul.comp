#version 450
#include "matmul.glsl"
