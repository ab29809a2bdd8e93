#include "core/model/tensor_binder.h"

#include <cinttypes>

#include "base/quant_ref.h"
#include "platforms/platform.h"

namespace moelite {

namespace {
std::string shape_str(const gguf::TensorInfo& t) {
  std::string s = "{";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "}";
}
}  // namespace

Status TensorBinder::lookup(const std::string& name, bool required, const gguf::TensorInfo** out) {
  *out = gguf_.find_tensor(name);
  if (!*out && required)
    return fail(MOELITE_ERR_MISSING_TENSOR, "tensor '%s' is required by architecture '%s' but absent", name.c_str(),
                model_.hp.arch.c_str());
  return MOELITE_OK;
}

Status TensorBinder::data_of(const gguf::TensorInfo& info, const uint8_t** out, bool expert) {
  if (expert && lazy_experts_) {
    *out = model_.mapping.data() ? model_.mapping.data() + info.file_offset : nullptr;
  } else if (model_.mapping.data()) {
    *out = model_.mapping.data() + info.file_offset;
  } else {
    void* p = platform::aligned_alloc_bytes(static_cast<size_t>(info.size_bytes), 64);
    if (!p)
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "no memory for tensor '%s' (%" PRIu64 " bytes)", info.name.c_str(),
                  info.size_bytes);
    model_.owned.push_back(p);
    MOELITE_TRY(gguf_.file().read_at(info.file_offset, p, info.size_bytes));
    *out = static_cast<const uint8_t*>(p);
  }
  bound_bytes_ += info.size_bytes;
  return MOELITE_OK;
}

Status TensorBinder::view_data(const gguf::TensorInfo& info, bool expert, WeightView* out) {
  MOELITE_TRY(data_of(info, &out->data, expert));
  const platform::Mapping& m = model_.mapping;
  out->mapped = out->data && m.data() && out->data >= m.data() && out->data < m.data() + m.size();
  return MOELITE_OK;
}

Status TensorBinder::bind_matrix(const std::string& name, int64_t cols, int64_t rows, bool required, bool expert,
                                 WeightView* out) {
  const gguf::TensorInfo* t;
  MOELITE_TRY(lookup(name, required, &t));
  if (!t) {
    *out = WeightView{};
    return MOELITE_OK;
  }
  if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
    return fail(MOELITE_ERR_BAD_SHAPE, "tensor '%s' has shape %s, expected {%lld, %lld}", name.c_str(),
                shape_str(*t).c_str(), (long long)cols, (long long)rows);
  const TypeInfo* ti = type_info(static_cast<uint32_t>(t->type));
  if (!ti->computable)
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE,
                "tensor '%s' uses type %s, which moelite cannot compute with (supported: F32, F16, BF16, "
                "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                name.c_str(), ti->name);
  out->type = t->type;
  out->cols = cols;
  out->rows = rows;
  out->row_bytes = t->row_bytes;
  out->file_offset = t->file_offset;
  return view_data(*t, expert, out);
}

Status TensorBinder::matrix(const std::string& name, int64_t cols, int64_t rows, WeightView* out, bool required) {
  return bind_matrix(name, cols, rows, required, false, out);
}

Status TensorBinder::expert_matrix(const std::string& name, int64_t cols, int64_t rows, WeightView* out) {
  return bind_matrix(name, cols, rows, true, true, out);
}

Status TensorBinder::owned_floats(size_t n, float** out) {
  model_.owned.push_back(nullptr);  // first, so that nothing allocated can leak if it throws
  void* p = platform::aligned_alloc_bytes(n * sizeof(float), 64);
  if (!p) return fail(MOELITE_ERR_OUT_OF_MEMORY, "no memory for %zu derived weights", n);
  model_.owned.back() = p;
  *out = static_cast<float*>(p);
  return MOELITE_OK;
}

Status TensorBinder::matrix_stack(const std::string& name, int64_t cols, int64_t rows, int64_t n, WeightView* out,
                                  uint64_t* stride, bool expert) {
  const gguf::TensorInfo* t;
  MOELITE_TRY(lookup(name, true, &t));
  if (t->n_dims != 3 || t->ne[0] != cols || (rows >= 0 && t->ne[1] != rows) || t->ne[2] != n)
    return fail(MOELITE_ERR_BAD_SHAPE, "tensor '%s' has shape %s, expected {%lld, %s, %lld}", name.c_str(),
                shape_str(*t).c_str(), (long long)cols, rows >= 0 ? std::to_string(rows).c_str() : "n_ff",
                (long long)n);
  const TypeInfo* ti = type_info(static_cast<uint32_t>(t->type));
  if (!ti->computable)
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "tensor '%s' uses type %s, which moelite cannot compute with",
                name.c_str(), ti->name);
  out->type = t->type;
  out->cols = cols;
  out->rows = t->ne[1];
  out->row_bytes = t->row_bytes;
  out->file_offset = t->file_offset;
  *stride = t->row_bytes * static_cast<uint64_t>(t->ne[1]);
  return view_data(*t, expert, out);
}

Status TensorBinder::floats(const std::string& name, int64_t n, std::vector<float>* out, bool required) {
  return float_table(name, n, 1, out, required);
}

Status TensorBinder::float_table(const std::string& name, int64_t cols, int64_t rows, std::vector<float>* out,
                                 bool required) {
  const gguf::TensorInfo* t;
  MOELITE_TRY(lookup(name, required, &t));
  if (!t) {
    out->clear();
    return MOELITE_OK;
  }
  if (static_cast<int64_t>(t->n_elements) != cols * rows || t->ne[0] != cols) {
    if (rows == 1)
      return fail(MOELITE_ERR_BAD_SHAPE, "tensor '%s' has shape %s, expected {%lld}", name.c_str(),
                  shape_str(*t).c_str(), (long long)cols);
    return fail(MOELITE_ERR_BAD_SHAPE, "tensor '%s' has shape %s, expected {%lld, %lld}", name.c_str(),
                shape_str(*t).c_str(), (long long)cols, (long long)rows);
  }
  DequantRowFn dequant = dequant_row_fn(t->type);
  if (!dequant)
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "tensor '%s' uses unsupported type %s", name.c_str(), type_name(t->type));
  std::vector<uint8_t> bytes(static_cast<size_t>(t->size_bytes));
  MOELITE_TRY(gguf_.file().read_at(t->file_offset, bytes.data(), t->size_bytes));
  bound_bytes_ += t->size_bytes;
  out->resize(static_cast<size_t>(cols * rows));
  for (int64_t r = 0; r < rows; ++r)
    dequant(bytes.data() + static_cast<uint64_t>(r) * t->row_bytes, out->data() + r * cols, cols);
  return MOELITE_OK;
}

}  // namespace moelite
