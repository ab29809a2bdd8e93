// SPIR-V of the compute shaders in shaders/, compiled by glslc at build time and embedded
// (generated vk_shaders.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace moelite::vk {

struct ShaderBlob {
  const char* name;
  const uint32_t* code;
  size_t words;
};

// The shader compiled from shaders/NAME.comp, or nullptr.
const ShaderBlob* find_shader(const char* name);

}  // namespace moelite::vk
