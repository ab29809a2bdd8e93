// Looks tensors up by name, checks their shapes and types against what the architecture expects,
// and turns them into WeightViews (or dequantized float vectors for norms and biases).
#pragma once
#include <set>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/gguf/reader.h"
#include "core/model/model.h"

namespace moelite {

class TensorBinder {
 public:
  explicit TensorBinder(Model& model) : model_(model), gguf_(*model.gguf) {}

  bool has(const std::string& name) const { return gguf_.find_tensor(name) != nullptr; }
  // ne[d] of a tensor, or -1 if it is absent.
  int64_t dim(const std::string& name, int d) const {
    const gguf::TensorInfo* t = gguf_.find_tensor(name);
    return t ? t->ne[d] : -1;
  }

  // A 2-D matrix with ne = {cols, rows}. Missing: MOELITE_ERR_MISSING_TENSOR (when required;
  // otherwise OK with an invalid view). Wrong shape: MOELITE_ERR_BAD_SHAPE. A type without
  // kernels: MOELITE_ERR_UNSUPPORTED_TYPE.
  Status matrix(const std::string& name, int64_t cols, int64_t rows, WeightView* out, bool required = true);
  // A 3-D stack of n matrices ne = {cols, rows, n}; `out` describes matrix 0 and *stride the
  // bytes from one matrix to the next. rows may be -1 to accept any (read back from out->rows).
  // Routed experts' stacks honour set_lazy_experts; a dense stack (expert false) is always read.
  Status matrix_stack(const std::string& name, int64_t cols, int64_t rows, int64_t n, WeightView* out,
                      uint64_t* stride, bool expert = true);
  // n floats the model owns (freed with it), for weights derived at load.
  Status owned_floats(size_t n, float** out);
  // A vector of n values of any supported type, dequantized to floats (norm weights, biases).
  Status floats(const std::string& name, int64_t n, std::vector<float>* out, bool required = true);
  // A 2-D table ne = {cols, rows} of any supported type as rows * cols floats (per-expert biases).
  Status float_table(const std::string& name, int64_t cols, int64_t rows, std::vector<float>* out,
                     bool required = true);

  // Routed-expert tensors bound from now on are not read or touched (the expert store reads
  // them itself): their views carry the file offset, and data only when the file is mapped.
  void set_lazy_experts(bool lazy) { lazy_experts_ = lazy; }
  // Binds an expert matrix (per-expert tensor layout) honouring set_lazy_experts.
  Status expert_matrix(const std::string& name, int64_t cols, int64_t rows, WeightView* out);

  // Bytes of the tensors bound so far.
  uint64_t bound_bytes() const { return bound_bytes_; }

 private:
  Status lookup(const std::string& name, bool required, const gguf::TensorInfo** out);
  Status bind_matrix(const std::string& name, int64_t cols, int64_t rows, bool required, bool expert, WeightView* out);
  Status data_of(const gguf::TensorInfo& info, const uint8_t** out, bool expert = false);
  // data_of into out->data, and out->mapped: whether those bytes are the file mapping's.
  Status view_data(const gguf::TensorInfo& info, bool expert, WeightView* out);

  Model& model_;
  const gguf::Reader& gguf_;
  uint64_t bound_bytes_ = 0;
  bool lazy_experts_ = false;
};

}  // namespace moelite
