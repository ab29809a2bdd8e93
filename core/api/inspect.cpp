// The C API's inspection side: moelite_model_inspect, GGUF metadata and token attributes, the
// packed expert file.
// Argument checks and translation, nothing else.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "base/options.h"
#include "core/api/handles.h"
#include "core/experts/expert_pack.h"
#include "core/gguf/value_text.h"
#include "core/text/tokenizer.h"
#include "moelite.h"

using moelite::fail;
using moelite::api::guarded;
using moelite::api::null_arg;

namespace {
// A model's facts without the cost of a load (LoadOptions::inspect_only), after the environment's
// options are checked.
moelite_status load_inspected(const char* path, std::unique_ptr<moelite::Model>* out) {
  MOELITE_TRY(moelite::check_options());
  moelite::LoadOptions opts;
  opts.inspect_only = true;
  return moelite::Model::load(path, opts, out);
}
}  // namespace

extern "C" {

MOELITE_API moelite_status moelite_model_inspect(const char* path, moelite_model** out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!path) return null_arg(api_fn, "path");
    if (!out) return null_arg(api_fn, "out_model");
    std::unique_ptr<moelite::Model> m;
    MOELITE_TRY(load_inspected(path, &m));
    *out = new moelite_model{std::move(m), nullptr};
    return MOELITE_OK;
  });
}

MOELITE_API int32_t moelite_model_meta_count(const moelite_model* model) {
  if (!model || !model->impl->gguf) return 0;
  return static_cast<int32_t>(model->impl->gguf->metadata().size());
}

MOELITE_API const char* moelite_model_meta_key(const moelite_model* model, int32_t i) {
  if (!model || !model->impl->gguf || i < 0) return nullptr;
  const auto& kv = model->impl->gguf->metadata();
  return static_cast<size_t>(i) < kv.size() ? kv[static_cast<size_t>(i)].key.c_str() : nullptr;
}

MOELITE_API moelite_status moelite_model_meta_value(const moelite_model* model, const char* key, char* buf,
                                                    size_t capacity, size_t* len) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!key) return null_arg(api_fn, "key");
    if (!len) return null_arg(api_fn, "len");
    if (!buf && capacity > 0) return null_arg(api_fn, "buf");
    const moelite::gguf::Value* v = model->impl->gguf ? model->impl->gguf->find(key) : nullptr;
    if (!v) return fail(MOELITE_ERR_MISSING_METADATA, "the model file has no metadata key '%s'", key);
    const std::string text = moelite::gguf::value_to_text(*v);
    if (text.size() + 1 > capacity) {
      *len = text.size();
      return fail(MOELITE_ERR_BUFFER_TOO_SMALL, "metadata '%s' needs %zu bytes with its NUL, the buffer has %zu", key,
                  text.size() + 1, capacity);
    }
    memcpy(buf, text.c_str(), text.size() + 1);
    *len = text.size();
    return MOELITE_OK;
  });
}

MOELITE_API uint32_t moelite_token_attrs(const moelite_model* model, int32_t token) {
  if (!model || !model->impl->tokenizer) return 0;
  const moelite::Tokenizer& tok = *model->impl->tokenizer;
  if (token < 0 || token >= tok.n_tokens()) return 0;
  uint32_t flags = 0;
  switch (tok.attr(token)) {
    case moelite::TokenAttr::Normal: flags = MOELITE_TOKEN_ATTR_NORMAL; break;
    case moelite::TokenAttr::Unknown: flags = MOELITE_TOKEN_ATTR_UNKNOWN; break;
    case moelite::TokenAttr::Control: flags = MOELITE_TOKEN_ATTR_CONTROL; break;
    case moelite::TokenAttr::UserDefined: flags = MOELITE_TOKEN_ATTR_USER_DEFINED; break;
    case moelite::TokenAttr::Unused: flags = MOELITE_TOKEN_ATTR_UNUSED; break;
    case moelite::TokenAttr::Byte: flags = MOELITE_TOKEN_ATTR_BYTE; break;
  }
  if (tok.is_end_of_generation(token)) flags |= MOELITE_TOKEN_ATTR_END;
  return flags;
}

MOELITE_API const char* moelite_token_text(const moelite_model* model, int32_t token) {
  if (!model || !model->impl->tokenizer) return nullptr;
  const moelite::Tokenizer& tok = *model->impl->tokenizer;
  if (token < 0 || token >= tok.n_tokens()) return nullptr;
  return tok.text(token).c_str();
}

MOELITE_API moelite_status moelite_pack_experts(const char* model_path, const char* out_path,
                                                moelite_progress_fn progress, void* user_data) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model_path) return null_arg(api_fn, "model_path");
    std::unique_ptr<moelite::Model> m;
    MOELITE_TRY(load_inspected(model_path, &m));
    const std::string out = out_path ? std::string(out_path) : std::string(model_path) + moelite::kPackedSuffix;
    moelite::PackResult r;
    return moelite::pack_experts(*m, out, progress, user_data, &r);
  });
}

MOELITE_API const char* moelite_model_expert_file(const moelite_model* model) {
  if (!model) return nullptr;
  const moelite::Model& m = *model->impl;
  return m.packed.present() ? m.packed.path.c_str() : m.path.c_str();
}

MOELITE_API moelite_status moelite_model_measure_expert_compression(const moelite_model* model, int32_t level,
                                                                    int32_t max_experts,
                                                                    moelite_expert_compression* rows, int32_t capacity,
                                                                    int32_t* n_rows) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!n_rows) return null_arg(api_fn, "n_rows");
    if (!rows && capacity > 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: rows is NULL with capacity %d", api_fn, capacity);
    if (capacity < 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: capacity %d is negative", api_fn, capacity);
    if (level < 0 || level > 19) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: level %d is outside 0..19", api_fn, level);
    if (max_experts < 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: max_experts %d is negative", api_fn, max_experts);
    if (model->impl->vocab_only) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: a vocabulary-only model has no experts", api_fn);
    std::vector<moelite::CompressionRow> found;
    MOELITE_TRY(moelite::measure_expert_compression(*model->impl, level ? level : 3, max_experts ? max_experts : 64, &found));
    *n_rows = static_cast<int32_t>(found.size());
    for (size_t i = 0; i < found.size() && i < static_cast<size_t>(capacity); ++i) {
      moelite_expert_compression& r = rows[i];
      memset(&r, 0, sizeof r);
      r.weight_type = moelite::type_name(found[i].type);
      r.matrices = found[i].matrices;
      r.raw_bytes = found[i].raw_bytes;
      r.zstd_bytes = found[i].zstd_bytes;
      r.decompress_gb_per_s = found[i].decompress_gb_s;
    }
    if (found.size() > static_cast<size_t>(capacity))
      return fail(MOELITE_ERR_BUFFER_TOO_SMALL, "%s: %zu rows, room for %d", api_fn, found.size(), capacity);
    return MOELITE_OK;
  });
}

}  // extern "C"
