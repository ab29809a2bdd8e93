#include "core/model/load_checks.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <string>

namespace moelite {

namespace {

// The N of a "blk.N.*" tensor name, or -1 for any other name. N is capped just above the largest
// block count the loader accepts, so that no digit string can overflow.
int64_t block_of(const std::string& name) {
  constexpr int64_t kCap = int64_t{MOELITE_MAX_LAYERS} + 1;
  if (name.compare(0, 4, "blk.") != 0) return -1;
  size_t i = 4;
  int64_t n = 0;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    n = std::min(kCap, n * 10 + (name[i] - '0'));
  if (i == 4 || i == name.size() || name[i] != '.') return -1;
  return n;
}

}  // namespace

Status check_block_count(const gguf::Reader& g, const HParams& hp) {
  int64_t last = -1;
  const std::string* last_name = nullptr;
  for (const gguf::TensorInfo& t : g.tensors()) {
    const int64_t n = block_of(t.name);
    if (n > last) {
      last = n;
      last_name = &t.name;
    }
  }
  const int64_t declared = int64_t{hp.n_layer} + hp.n_nextn;
  // GLM's multi-token-prediction blocks (the last n_nextn) draft tokens and are never computed: a
  // file without them still has every block the model computes. Any other shortfall would run
  // fewer layers than the model has, and a surplus would leave trained layers out, both silently.
  const int64_t fewest = hp.n_nextn > 0 ? hp.n_layer : declared;
  if (last + 1 >= fewest && last + 1 <= declared) return MOELITE_OK;
  if (last < 0)
    return fail(MOELITE_ERR_BAD_METADATA,
                "metadata key '%s.block_count' = %" PRId64 " but the file has no blk.N tensors", hp.arch.c_str(),
                declared);
  return fail(MOELITE_ERR_BAD_METADATA,
              "metadata key '%s.block_count' = %" PRId64 " disagrees with the tensors: the last block is blk.%" PRId64
              " ('%s'), so the file has %" PRId64 " blocks",
              hp.arch.c_str(), declared, last, last_name->c_str(), last + 1);
}

// Refused both ways rather than sampling restricted to the vocabulary, as llama.cpp does (it sizes
// token_embd and output from the token list, so any other row count is a shape error there).
// Converters pad the token list to the embedding's rows ([PAD...] entries), so real files agree.
// Fewer tokens than rows: the head scores ids the tokenizer has no text for, and sampling picks
// them; more tokens than rows: the tokenizer produces ids with no embedding.
Status check_vocabulary(const gguf::Reader& g, const Model& m) {
  const HParams& hp = m.hp;
  const std::string size_key = hp.arch + ".vocab_size";
  if (g.find(size_key)) {
    int64_t n;
    if (!g.get_int(size_key, &n))
      return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s' must be an integer", size_key.c_str());
    if (n != hp.n_vocab)
      return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' = %" PRId64 " but token_embd.weight has %d rows",
                  size_key.c_str(), n, hp.n_vocab);
  }
  if (!m.tokenizer) return MOELITE_OK;  // no text: logits only, over the embedding's rows
  const int32_t n_tokens = m.tokenizer->n_tokens();
  if (n_tokens == hp.n_vocab) return MOELITE_OK;
  return fail(
      MOELITE_ERR_BAD_METADATA,
      "metadata key 'tokenizer.ggml.tokens' has %d tokens but token_embd.weight has %d rows (one per token): %s",
      n_tokens, hp.n_vocab,
      n_tokens < hp.n_vocab ? "ids past the vocabulary would be sampled without text"
                            : "ids past the embedding rows would have no embedding");
}

Status check_expert_widths(const Model& m) {
  const HParams& hp = m.hp;
  // A width in the file is range-checked when read and every expert tensor bound against it; only a
  // width taken from the tensors (the key absent) can be 0, and an expert of no rows adds nothing.
  for (int32_t l = hp.n_dense_lead; l < hp.n_layer; ++l) {
    const LayerWeights& lw = m.layers[static_cast<size_t>(l)];
    const LayerExperts& ex = lw.experts;
    const int64_t rows = ex.split.empty() ? ex.gate.rows : ex.split[0].gate.rows;
    if (rows < 1)
      return fail(MOELITE_ERR_BAD_METADATA,
                  "metadata key '%s.expert_feed_forward_length' is absent and layer %d's routed experts have %" PRId64
                  " rows: an expert needs at least 1",
                  hp.arch.c_str(), l, rows);
    if (lw.has_shared && lw.shared.gate.rows < 1)
      return fail(MOELITE_ERR_BAD_METADATA,
                  "metadata key '%s.expert_shared_feed_forward_length' is absent and layer %d's shared expert has "
                  "%" PRId64 " rows: an expert needs at least 1",
                  hp.arch.c_str(), l, lw.shared.gate.rows);
  }
  return MOELITE_OK;
}

}  // namespace moelite
