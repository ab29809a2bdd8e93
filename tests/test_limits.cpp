// Counts a model file controls are bounded before anything is sized from them (include/moelite.h,
// "Limits"), and routing is exact for every expert count the loader accepts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "moelite.h"
#include "tests/gguf_builder.h"

namespace {

using moelite::testing_gguf::GgufBuilder;
using moelite::testing_gguf::TempFile;

// Reference top-k: a full stable sort by probability, descending (stable = ties to the lower id).
std::vector<int32_t> reference_top_k(const std::vector<float>& p, int32_t k) {
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  order.resize(static_cast<size_t>(k));
  return order;
}

void expect_top_k(const std::vector<float>& p, int32_t k) {
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k));
  moelite::cpu::top_k(p.data(), static_cast<int32_t>(p.size()), k, ids.data(), w.data());
  const std::vector<int32_t> want = reference_top_k(p, k);
  ASSERT_EQ(ids, want) << "n=" << p.size() << " k=" << k;
  for (int32_t j = 0; j < k; ++j) EXPECT_EQ(w[static_cast<size_t>(j)], p[static_cast<size_t>(want[j])]);
}

TEST(RoutingLimits, TopKChoosesExpertsAbove1024) {
  // 1100 experts, top-2: the two best are 1050 and 1099 (experts a fixed 1024-entry order array
  // could never return).
  std::vector<float> p(1100, 0.5f / 1100);
  p[1050] = 0.3f;
  p[1099] = 0.2f;
  expect_top_k(p, 2);
}

TEST(RoutingLimits, TopKLargeKAndTies) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> coarse(0, 50);  // many ties: ordering must fall to the lower id
  for (int32_t n : {1, 1023, 1024, 1025, 2048, MOELITE_MAX_EXPERTS}) {
    std::vector<float> p(static_cast<size_t>(n));
    for (float& x : p) x = static_cast<float>(coarse(rng)) / 50.0f;
    for (int32_t k : {1, std::min(n, 2), std::min(n, 1100), n}) expect_top_k(p, k);
  }
}

// A llama (Mixtral-style) MoE model with F32 tensors of the given sizes; tensor contents are the
// builder's byte pattern (loading never looks at values).
struct ModelSpec {
  int64_t n_layer = 1, n_expert = 4, n_expert_used = 2, n_embd = 8, n_head = 2, n_ff = 4, n_vocab = 16;
  int64_t ctx = 64;
  int64_t meta_embd = 0;  // > 0: the embedding_length written, the tensors keep n_embd
};

std::vector<uint8_t> build_model(const ModelSpec& s, void (*extra)(GgufBuilder&) = nullptr) {
  GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  g.kv_u32("llama.block_count", static_cast<uint32_t>(s.n_layer));
  g.kv_u32("llama.embedding_length", static_cast<uint32_t>(s.meta_embd > 0 ? s.meta_embd : s.n_embd));
  g.kv_u32("llama.attention.head_count", static_cast<uint32_t>(s.n_head));
  g.kv_u32("llama.context_length", static_cast<uint32_t>(s.ctx));
  g.kv_u32("llama.expert_count", static_cast<uint32_t>(s.n_expert));
  g.kv_u32("llama.expert_used_count", static_cast<uint32_t>(s.n_expert_used));
  g.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  if (extra) extra(g);
  const int64_t e = s.n_embd;
  g.tensor("token_embd.weight", {e, s.n_vocab}, 0);
  g.tensor("output_norm.weight", {e}, 0);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    g.tensor(b + "attn_norm.weight", {e}, 0);
    for (const char* m : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"})
      g.tensor(b + m, {e, e}, 0);
    g.tensor(b + "ffn_norm.weight", {e}, 0);
    g.tensor(b + "ffn_gate_inp.weight", {e, s.n_expert}, 0);
    g.tensor(b + "ffn_gate_exps.weight", {e, s.n_ff, s.n_expert}, 0);
    g.tensor(b + "ffn_up_exps.weight", {e, s.n_ff, s.n_expert}, 0);
    g.tensor(b + "ffn_down_exps.weight", {s.n_ff, e, s.n_expert}, 0);
  }
  return g.build();
}

moelite_status load(const std::vector<uint8_t>& bytes, std::string* error = nullptr) {
  TempFile f("", bytes);
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_backend(p, MOELITE_BACKEND_CPU);
  moelite_model_params_set_threads(p, 1);
  moelite_model* m = nullptr;
  const moelite_status st = moelite_model_load(f.path().c_str(), p, &m);
  if (error) *error = moelite_last_error();
  moelite_model_free(m);
  moelite_model_params_free(p);
  return st;
}

TEST(ModelLimits, ValidSmallModelLoads) {
  std::string err;
  EXPECT_EQ(load(build_model(ModelSpec{}), &err), MOELITE_OK) << err;
}

TEST(ModelLimits, ManyExpertsWithLargeTopKLoad) {
  ModelSpec s;
  s.n_expert = 2048;
  s.n_expert_used = 1100;
  s.n_embd = 4;
  s.n_head = 1;
  s.n_ff = 1;
  std::string err;
  EXPECT_EQ(load(build_model(s), &err), MOELITE_OK) << err;
}

// Each hostile value is refused with the status and a message naming the field and the limit.
void expect_refused(const ModelSpec& s, const char* field, const std::string& limit) {
  std::string err;
  EXPECT_EQ(load(build_model(s), &err), MOELITE_ERR_BAD_METADATA) << field;
  EXPECT_NE(err.find(field), std::string::npos) << err;
  EXPECT_NE(err.find(limit), std::string::npos) << err;
}

TEST(ModelLimits, HostileCountsAreRefused) {
  ModelSpec s;
  s.n_expert = MOELITE_MAX_EXPERTS + 1;
  expect_refused(s, "expert_count", std::to_string(MOELITE_MAX_EXPERTS));
  s = ModelSpec{};
  s.n_expert_used = 0;
  expect_refused(s, "expert_used_count", "[1, 4]");
  s.n_expert_used = 5;
  expect_refused(s, "expert_used_count", "[1, 4]");
  s = ModelSpec{};
  s.n_layer = MOELITE_MAX_LAYERS + 1;
  expect_refused(s, "block_count", std::to_string(MOELITE_MAX_LAYERS));
  s = ModelSpec{};
  s.meta_embd = MOELITE_MAX_WIDTH + 1;
  expect_refused(s, "embedding_length", std::to_string(MOELITE_MAX_WIDTH));
  s = ModelSpec{};
  s.n_head = MOELITE_MAX_HEADS + 1;
  expect_refused(s, "head_count", std::to_string(MOELITE_MAX_HEADS));
  s = ModelSpec{};
  s.ctx = int64_t{MOELITE_MAX_CONTEXT} + 1;
  expect_refused(s, "context_length", std::to_string(MOELITE_MAX_CONTEXT));
}

TEST(ModelLimits, DefaultHeadDimensionIsBounded) {
  // No key_length: head_dim = embedding_length / head_count = 8192, above MOELITE_MAX_HEAD_DIM.
  ModelSpec s;
  s.meta_embd = 8192;
  s.n_head = 1;
  expect_refused(s, "head dimension", std::to_string(MOELITE_MAX_HEAD_DIM));
  std::string err;
  EXPECT_EQ(load(build_model(ModelSpec{},
                             [](GgufBuilder& g) { g.kv_u32("llama.attention.key_length", MOELITE_MAX_HEAD_DIM + 1); }),
                 &err),
            MOELITE_ERR_BAD_METADATA);
  EXPECT_NE(err.find("attention.key_length"), std::string::npos) << err;
}

}  // namespace
