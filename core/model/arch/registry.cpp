#include <cstring>

#include "core/model/arch/arch.h"

namespace moelite {

extern const ArchDescriptor kArch_llama;
extern const ArchDescriptor kArch_qwen2moe;
extern const ArchDescriptor kArch_qwen3moe;
extern const ArchDescriptor kArch_olmoe;
extern const ArchDescriptor kArch_gpt_oss;
extern const ArchDescriptor kArch_granitemoe;
extern const ArchDescriptor kArch_phimoe;
extern const ArchDescriptor kArch_deepseek2;

namespace {
// A new architecture is one file defining its descriptor plus one line here.
const ArchDescriptor* const kArchs[] = {&kArch_llama, &kArch_qwen2moe, &kArch_qwen3moe, &kArch_olmoe, &kArch_gpt_oss, &kArch_granitemoe,
                                         &kArch_phimoe, &kArch_deepseek2};
}  // namespace

const ArchDescriptor* find_arch(const std::string& name) {
  for (const ArchDescriptor* a : kArchs)
    if (name == a->name) return a;
  return nullptr;
}

const char* supported_arch_list() { return "llama (Mixtral-style, with experts), qwen2moe, qwen3moe, olmoe, gpt-oss, granitemoe, phimoe, deepseek2"; }

}  // namespace moelite
