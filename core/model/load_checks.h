// Checks across a file's metadata and its tensors that no single key reader or tensor binder sees:
// each finds a file that would load and then compute something other than what it describes
// (fewer layers, ids without text, experts of no width), and refuses it with BAD_METADATA naming
// the key. Model::load runs them; core/model/arch/ checks each key on its own.
#pragma once
#include "base/status.h"
#include "core/gguf/reader.h"
#include "core/model/model.h"

namespace moelite {

// {arch}.block_count against the blk.N.* tensors: the highest N must be the last block. Before the
// layers are bound, so that a count above the tensors reads as the wrong count, not a missing tensor.
Status check_block_count(const gguf::Reader& gguf, const HParams& hp);

// The tokenizer's vocabulary (tokenizer.ggml.tokens, and {arch}.vocab_size where present) has one
// token per row of token_embd.weight. After the global tensors are bound (hp.n_vocab).
Status check_vocabulary(const gguf::Reader& gguf, const Model& model);

// Every MoE layer's routed experts (and shared expert, if any) have at least one row. After the
// layers are bound.
Status check_expert_widths(const Model& model);

}  // namespace moelite
