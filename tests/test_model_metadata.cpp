// Hyperparameters and the tensors they describe are checked against each other at load (issue 61,
// item 3): a file that would load and then compute something else -- NaN logits from a NaN
// epsilon, fewer layers than its tensors hold, ids without text, experts of no width, a rope
// scaling it names but moelite would not apply -- is refused with MOELITE_ERR_BAD_METADATA and a
// message naming the key. Each case changes one thing in a file that loads; the expectations are
// the documented status (include/moelite.h) and the key's name, not the loader's own output.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "moelite.h"
#include "tests/gguf_builder.h"

namespace {

using moelite::testing_gguf::GgufBuilder;
using moelite::testing_gguf::TempFile;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A small F32 MoE model; tensor contents are the builder's byte pattern (loading never computes).
struct Spec {
  std::string arch = "llama";
  int64_t block_count = 2;     // written as {arch}.block_count
  int64_t tensor_blocks = 2;   // blk.N tensors written for N < tensor_blocks
  int64_t skip_block = -1;     // a block whose tensors are left out
  int64_t n_ff = 4;            // every layer's expert rows
  int64_t zero_ff_layer = -1;  // a layer whose experts have no rows
  int64_t n_ff_shared = -1;    // >= 0: a shared expert of this width (qwen2moe)
  bool ff_key = true;          // write {arch}.expert_feed_forward_length = n_ff
  int64_t n_vocab = 16;        // token_embd rows
  int64_t n_tokens = 16;       // tokenizer.ggml.tokens entries; 0: no tokenizer
  float eps = 1e-5f;           // {arch}.attention.layer_norm_rms_epsilon
  // More keys.
  std::function<void(GgufBuilder&, const std::string& arch)> extra;
};

std::vector<uint8_t> build(const Spec& s) {
  const std::string a = s.arch;
  const int64_t e = 8, n_expert = 4;
  GgufBuilder g;
  g.kv_str("general.architecture", a);
  g.kv_u32(a + ".block_count", static_cast<uint32_t>(s.block_count));
  g.kv_u32(a + ".embedding_length", static_cast<uint32_t>(e));
  g.kv_u32(a + ".attention.head_count", 2);
  g.kv_u32(a + ".context_length", 64);
  g.kv_u32(a + ".expert_count", static_cast<uint32_t>(n_expert));
  g.kv_u32(a + ".expert_used_count", 2);
  g.kv_f32(a + ".attention.layer_norm_rms_epsilon", s.eps);
  if (s.ff_key) g.kv_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.n_ff));
  if (s.n_tokens > 0) {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    while (static_cast<int64_t>(tokens.size()) < s.n_tokens) tokens.push_back("t" + std::to_string(tokens.size()));
    tokens.resize(static_cast<size_t>(s.n_tokens));
    g.kv_str("tokenizer.ggml.model", "llama");
    g.kv_arr_str("tokenizer.ggml.tokens", tokens);
  }
  if (s.extra) s.extra(g, a);
  g.tensor("token_embd.weight", {e, s.n_vocab}, 0);
  g.tensor("output_norm.weight", {e}, 0);
  for (int64_t l = 0; l < s.tensor_blocks; ++l) {
    if (l == s.skip_block) continue;
    const std::string b = "blk." + std::to_string(l) + ".";
    const int64_t ff = l == s.zero_ff_layer ? 0 : s.n_ff;
    g.tensor(b + "attn_norm.weight", {e}, 0);
    for (const char* m : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"})
      g.tensor(b + m, {e, e}, 0);
    g.tensor(b + "ffn_norm.weight", {e}, 0);
    g.tensor(b + "ffn_gate_inp.weight", {e, n_expert}, 0);
    g.tensor(b + "ffn_gate_exps.weight", {e, ff, n_expert}, 0);
    g.tensor(b + "ffn_up_exps.weight", {e, ff, n_expert}, 0);
    g.tensor(b + "ffn_down_exps.weight", {ff, e, n_expert}, 0);
    if (s.n_ff_shared >= 0) {
      g.tensor(b + "ffn_gate_shexp.weight", {e, s.n_ff_shared}, 0);
      g.tensor(b + "ffn_up_shexp.weight", {e, s.n_ff_shared}, 0);
      g.tensor(b + "ffn_down_shexp.weight", {s.n_ff_shared, e}, 0);
    }
  }
  return g.build();
}

// Loads through the C API on the CPU, with an expert budget when budget > 0.
moelite_status load(const Spec& s, std::string* error, uint64_t budget = 0) {
  TempFile f("", build(s));
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_backend(p, MOELITE_BACKEND_CPU);
  moelite_model_params_set_threads(p, 1);
  if (budget > 0) moelite_model_params_set_expert_budget(p, budget);
  moelite_model* m = nullptr;
  const moelite_status st = moelite_model_load(f.path().c_str(), p, &m);
  *error = st == MOELITE_OK ? "" : moelite_last_error();
  moelite_model_free(m);
  moelite_model_params_free(p);
  return st;
}

void expect_bad_metadata(const Spec& s, const std::string& key, uint64_t budget = 0) {
  std::string err;
  EXPECT_EQ(load(s, &err, budget), MOELITE_ERR_BAD_METADATA) << key << ": " << err;
  EXPECT_NE(err.find("'" + key + "'"), std::string::npos) << "the message should name " << key << ": " << err;
}

void expect_loads(const Spec& s, uint64_t budget = 0) {
  std::string err;
  EXPECT_EQ(load(s, &err, budget), MOELITE_OK) << err;
}

TEST(ModelMetadata, TheBaseModelLoads) {
  expect_loads(Spec{});
  expect_loads(Spec{}, 1 << 20);
  Spec shared;
  shared.arch = "qwen2moe";
  shared.n_ff_shared = 4;
  expect_loads(shared);
}

// Item 1: without expert_feed_forward_length the width comes from the tensors, which may have no
// rows: such experts add nothing, and a budget's slots are sized by their bytes.
TEST(ModelMetadata, ExpertsWithoutRowsAreRefused) {
  Spec s;
  s.ff_key = false;
  s.n_ff = 0;
  expect_bad_metadata(s, "llama.expert_feed_forward_length");
  expect_bad_metadata(s, "llama.expert_feed_forward_length", 1 << 20);
  s.n_ff = 4;  // one layer only: the width read from layer 0 is fine
  s.zero_ff_layer = 1;
  expect_bad_metadata(s, "llama.expert_feed_forward_length");
  expect_bad_metadata(s, "llama.expert_feed_forward_length", 1 << 20);
  Spec shared;
  shared.arch = "qwen2moe";
  shared.n_ff_shared = 0;
  expect_bad_metadata(shared, "qwen2moe.expert_shared_feed_forward_length");
}

struct FloatCase {
  const char* suffix;
  float value;
};

// The base model with {arch}.suffix = value.
Spec with_float(Spec s, const FloatCase& c) {
  if (std::string(c.suffix) == "attention.layer_norm_rms_epsilon") {
    s.eps = c.value;  // the builder writes this key itself
  } else {
    s.extra = [c](GgufBuilder& g, const std::string& a) { g.kv_f32(a + "." + c.suffix, c.value); };
  }
  return s;
}

// Item 2: every number the forward pass divides by or takes a log, root or power of.
TEST(ModelMetadata, HyperparametersOutsideTheirRangeAreRefused) {
  const FloatCase bad[] = {
      {"attention.layer_norm_rms_epsilon", kNaN},
      {"attention.layer_norm_rms_epsilon", 0.0f},
      {"attention.layer_norm_rms_epsilon", -1e-6f},
      {"attention.layer_norm_rms_epsilon", kInf},
      {"attention.layer_norm_rms_epsilon", 2.0f},
      {"rope.freq_base", kNaN},
      {"rope.freq_base", 0.0f},
      {"rope.freq_base", -10000.0f},
      {"rope.freq_base", kInf},
      {"rope.freq_base", 1.0f},
      {"expert_weights_scale", kNaN},
      {"expert_weights_scale", 0.0f},
      {"expert_weights_scale", -1.0f},
      {"expert_weights_scale", kInf},
      {"expert_weights_scale", 1e7f},
      {"rope.scaling.attn_factor", kNaN},
      {"rope.scaling.attn_factor", 0.0f},
      {"rope.scaling.attn_factor", kInf},
  };
  for (const FloatCase& c : bad) {
    SCOPED_TRACE(std::string(c.suffix) + " = " + std::to_string(c.value));
    expect_bad_metadata(with_float(Spec{}, c), std::string("llama.") + c.suffix);
  }
  // Real models' values still load: the ranges are not tighter than the files in use.
  const FloatCase good[] = {
      {"attention.layer_norm_rms_epsilon", 1e-6f},
      {"rope.freq_base", 1e4f},
      {"rope.freq_base", 1e7f},
      {"expert_weights_scale", 16.0f},
      {"expert_weights_scale", 2.5f},
      {"rope.scaling.attn_factor", 1.19f},
  };
  for (const FloatCase& c : good) {
    SCOPED_TRACE(std::string(c.suffix) + " = " + std::to_string(c.value));
    expect_loads(with_float(Spec{}, c));
  }
}

// YaRN's parameters are read (and checked) only with a YaRN scaling to apply.
TEST(ModelMetadata, YarnParametersOutsideTheirRangeAreRefused) {
  const FloatCase bad[] = {{"rope.scaling.yarn_beta_fast", kNaN},
                           {"rope.scaling.yarn_beta_slow", 0.0f},
                           {"rope.scaling.yarn_beta_fast", -1.0f},
                           {"rope.scaling.yarn_log_multiplier", kInf},
                           {"rope.scaling.yarn_log_multiplier", kNaN},
                           {"rope.scaling.factor", kNaN},
                           {"rope.scaling.factor", 0.5f},
                           {"rope.scaling.factor", kInf}};
  for (const FloatCase& c : bad) {
    SCOPED_TRACE(std::string(c.suffix) + " = " + std::to_string(c.value));
    Spec s;
    s.extra = [c](GgufBuilder& g, const std::string& a) {
      g.kv_str(a + ".rope.scaling.type", "yarn");
      if (std::string(c.suffix) != "rope.scaling.factor") g.kv_f32(a + ".rope.scaling.factor", 4.0f);
      g.kv_f32(a + "." + c.suffix, c.value);
    };
    expect_bad_metadata(s, std::string("llama.") + c.suffix);
  }
  Spec ok;
  ok.extra = [](GgufBuilder& g, const std::string& a) {
    g.kv_str(a + ".rope.scaling.type", "yarn");
    g.kv_f32(a + ".rope.scaling.factor", 4.0f);
    g.kv_f32(a + ".rope.scaling.yarn_log_multiplier", 0.1f);
  };
  expect_loads(ok);
}

// Item 3: one token per embedding row, as llama.cpp requires; more rows than tokens would let
// sampling pick ids the tokenizer has no text for.
TEST(ModelMetadata, VocabularyMustMatchTheEmbeddingRows) {
  Spec s;
  s.n_tokens = 12;
  expect_bad_metadata(s, "tokenizer.ggml.tokens");
  s.n_tokens = 20;
  expect_bad_metadata(s, "tokenizer.ggml.tokens");
  s.n_tokens = 0;  // no tokenizer: logits over the embedding's rows, nothing to disagree with
  expect_loads(s);
  Spec sized;
  sized.extra = [](GgufBuilder& g, const std::string& a) { g.kv_u32(a + ".vocab_size", 17); };
  expect_bad_metadata(sized, "llama.vocab_size");
  sized.extra = [](GgufBuilder& g, const std::string& a) { g.kv_u32(a + ".vocab_size", 16); };
  expect_loads(sized);
}

// Item 4: block_count is the number of blk.N blocks in the tensors, no fewer and no more.
TEST(ModelMetadata, BlockCountMustMatchTheTensors) {
  Spec s;
  s.block_count = 1;  // the tensors hold 2 blocks: one would silently be left out
  expect_bad_metadata(s, "llama.block_count");
  s.block_count = 3;
  expect_bad_metadata(s, "llama.block_count");
  s.block_count = 3;  // a block missing in the middle is a missing tensor
  s.tensor_blocks = 3;
  s.skip_block = 1;
  std::string err;
  EXPECT_EQ(load(s, &err), MOELITE_ERR_MISSING_TENSOR) << err;
  EXPECT_NE(err.find("blk.1."), std::string::npos) << err;
  s = Spec{};
  s.block_count = 1;
  s.tensor_blocks = 0;
  expect_bad_metadata(s, "llama.block_count");
}

// Item 5: a rope scaling type moelite does not know is not read as none.
TEST(ModelMetadata, UnknownRopeScalingTypeIsRefused) {
  auto with_type = [](const std::string& type) {
    Spec s;
    s.extra = [type](GgufBuilder& g, const std::string& a) { g.kv_str(a + ".rope.scaling.type", type); };
    return s;
  };
  for (const char* t : {"ntk", "YARN", ""}) {
    std::string err;
    EXPECT_EQ(load(with_type(t), &err), MOELITE_ERR_BAD_METADATA) << t << ": " << err;
    EXPECT_NE(err.find("'llama.rope.scaling.type'"), std::string::npos) << err;
    EXPECT_NE(err.find("none, linear, yarn"), std::string::npos) << err;  // the accepted values
  }
  std::string err;  // a llama.cpp type, for architectures with LongRoPE factors only
  EXPECT_EQ(load(with_type("longrope"), &err), MOELITE_ERR_UNSUPPORTED_ARCH) << err;
  EXPECT_NE(err.find("longrope"), std::string::npos) << err;
  for (const char* t : {"none", "linear", "yarn"}) expect_loads(with_type(t));
}

}  // namespace
