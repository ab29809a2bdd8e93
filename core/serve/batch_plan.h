// The batch planner: how many sequences to decode together, and how to split a memory limit
// between their KV caches and the expert cache, from the model's shape and measured bandwidths.
//
// Under a memory limit the two compete: every sequence's KV cache (n_ctx positions, allocated when
// the context is made) is memory the expert cache does not get. More sequences share each
// expert read (a step reads the union of their experts once), but a smaller cache misses more.
// For each candidate n the planner predicts one decode step of n sequences (one token each):
//
//   chance a step uses expert i          a_i(n) = 1 - (1 - p_i)^n, p_i the share of tokens routed
//                                        to it (a profile's counts, else k/E: uniform routing)
//   distinct experts of a step           D(n) = sum of a_i over all layers' experts
//                                        (uniform: L E (1 - (1 - k/E)^n))
//   share of experts the cache holds     c(n) = min(1, slots(n) / (L E))
//   share of a step's experts it hits    h(n): LRU by Che's approximation over the a_i, per layer
//                                        for per-layer pools (uniform routing: exactly c(n)); 0 for
//                                        one global pool smaller than D(n) (layers visited in turn
//                                        are a cyclic scan: each evicts what the next step needs first)
//   bytes read from storage              R(n) = D(n) (1 - h(n)) expert_bytes
//   step time                            T(n) = R(n) / storage_bw + (dense + L D(n) expert_bytes) / compute_bw
//
// (the compute term only when a compute rate is given), and aggregate decode n / T(n). Reads are
// not assumed to overlap computation: measured on this project's machines, a budgeted step's reads
// take several times its computation, so the sum is the honest model. Skewed routing matters most
// to few sequences with a large cache (it holds the hot experts): without a profile the planner
// underrates them (tools/plan_table.py measures it).
//
// The pool layout is chosen with n unless the caller fixes it: one global pool where the step's
// experts fit in it (the default's behaviour), else per-layer pools ("uniform"), whose quota each
// layer keeps across steps. The replacement policy is taken to be LRU, the default.
//
// It takes the fewest sequences within kNearBest of the best predicted throughput (fewer sequences
// finish each request sooner and leave memory free). The lookahead (layers predicted ahead: 0 or
// 1) is 1 only when a step's reads take no longer than its computation, the only case where the
// reads can hide behind it; where reads dominate, wrong guesses only add bytes (measured with
// tools/batch_table.py --predictors none,next-gate).
//
// With a trace. The shares above treat each step as independent of the one before, so they miss a
// sequence's locality: its next token tends to reuse the experts its last ones used
// (tools/plan_table.py --trace: one sequence of the shipped model hit 0.78 where uniform routing
// predicts 0.44).
// Given a recorded routing of one sequence, the planner measures D(n) and h(n) instead: n
// sequences are n copies of the trace started tokens / n apart (wrapping around), a step's layer
// reads the union of its sequences' experts, and that sequence of steps is replayed through LRU
// (core/experts/trace_replay.h: per-layer pools by Mattson's stack at the row's share of slots,
// interpolated between whole slots; one global pool by replay, hit share 0 where one layer of a
// step alone outnumbers its slots), twice over, counting the second pass only (the steady state,
// not the cold start).
//
// Pure arithmetic, tested on numbers worked by hand (tests/test_batch_plan.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace moelite {

// The plan takes the fewest sequences whose predicted throughput is within this share of the best.
constexpr double kNearBest = 0.05;
// Routing shares of at most this many experts (all layers) are modelled: each candidate costs about
// 100 passes over them. Real models have a few thousand (128 experts x 48 layers: 6144;
// DeepSeek-V3, 256 x 58: 14848); beyond, plan_batch refuses the shares (plan with uniform routing).
constexpr size_t kMaxRoutingCells = size_t{1} << 16;

enum class CachePools { kChoose, kGlobal, kPerLayer };

// At most this many decode steps of a recorded routing are replayed per candidate n; a longer trace
// still spreads its sequences' starting points over all of it.
constexpr int32_t kMaxReplayedSteps = 1024;
// And the replays of one plan do at most about this much work in all, counted as accesses times
// experts a layer (a step of n sequences reads up to n k experts in each of L layers, and each
// access looks through its layer's recency stack): each candidate gets an equal share, and big
// models or many candidates replay fewer steps (at least one) rather than plan for minutes.
// 2^30 took 1.4-3.2 s here (Zen 5, 16-256 candidates); the bench model (8 x 64 experts, top-8) replays 1 024 steps for
// each of 16 candidates, a Qwen3-30B-shaped one (48 x 128, top-8) 85 at 16 sequences.
constexpr double kMaxReplayWork = 1073741824.0;

// A recorded routing of one sequence (`moelite trace record`): each token's experts in each MoE
// layer, token-major: experts[token * n_moe_layers + layer].
struct RoutingTrace {
  int32_t tokens = 0;
  std::vector<std::vector<int32_t>> experts;
};

struct BatchPlanInputs {
  uint64_t memory = 0;            // bytes for everything below (the room, or the caller's limit)
  uint64_t dense = 0;             // non-expert weights as they sit in memory
  uint64_t context_base = 0;      // a context's bytes that do not grow with sequences (activations)
  uint64_t kv_per_sequence = 0;   // one sequence's KV cache at the planned n_ctx
  uint64_t headroom = 0;          // set aside for everything else
  uint64_t fixed_budget = 0;      // > 0: the expert budget is given (a loaded model); 0: the planner sizes it
  bool resident = false;          // no budget: weights are a file mapping, the page cache's (pass dense = 0)
  uint64_t slot_bytes = 0;        // one expert's slot in the pool
  uint64_t minimum_budget = 0;    // the store's minimum working set with one global pool
  uint64_t minimum_per_layer = 0;  // ... with a pool per layer (k + 1 slots in each)
  CachePools pools = CachePools::kChoose;
  uint64_t all_experts = 0;       // a pool holding every expert
  int32_t n_moe_layers = 0;
  int32_t n_expert = 0;
  int32_t n_expert_used = 0;
  int32_t min_sequences = 1;      // at least this many (min = max: plan the pools and budget for exactly n)
  int32_t max_sequences = 1;      // at most this many (the requests waiting, or the caller's cap)
  double storage_bytes_per_s = 0;  // measured read bandwidth of the model's storage (> 0 when streaming)
  double compute_bytes_per_s = 0;  // weight bytes a decode step computes per second; 0: not modelled
  // Per MoE layer and expert, the share of tokens routed to it (a calibration profile's counts over
  // its tokens; each layer sums to top-k). Empty: uniform, k / E each.
  std::vector<double> routing;
  // A recorded routing, replayed instead of the shares (see "With a trace" above). Null: shares.
  std::shared_ptr<const RoutingTrace> trace;
};

struct BatchPlanRow {
  int32_t n_seq = 0;
  uint64_t kv_bytes = 0;         // all sequences' KV caches
  uint64_t expert_budget = 0;    // what the expert cache gets (0 with resident)
  double cache_share = 0;        // c(n)
  bool per_layer = false;        // the pools this row assumes
  double hit_share = 0;          // h(n)
  double distinct_experts = 0;   // D(n) / L: per MoE layer
  double read_bytes = 0;         // R(n), per step
  double read_seconds = 0;       // R(n) / storage_bw
  double compute_seconds = 0;    // the step's weight bytes / compute_bw (0: no compute rate)
  double step_seconds = 0;       // T(n): their sum
  double tok_s = 0;              // n / T(n), all sequences together
  bool fits = false;             // the memory holds it (budget at least the minimum working set)
};

struct BatchPlan {
  int32_t n_seq = 0;
  uint64_t expert_budget = 0;     // bytes to load the model with (0: resident)
  uint64_t kv_bytes = 0;
  int32_t lookahead = 0;          // layers to predict ahead (0: no predictor)
  bool per_layer = false;         // per-layer pools ("uniform") rather than one global pool
  double tok_s = 0;               // predicted aggregate decode
  std::vector<BatchPlanRow> rows;  // every candidate n = 1..max_sequences
  std::string reason;              // one sentence: what bounded the choice
};

// The pools a plan or row assumes, as the cache-allocation name to load with: "none" (resident),
// "uniform" (a pool per layer) or "global".
const char* plan_pools_name(bool resident, bool per_layer);

// The plan, or MOELITE_ERR_BUDGET_TOO_SMALL when not even min_sequences fit beside the minimum
// working set (every term in the message), MOELITE_ERR_INVALID_ARGUMENT for inputs that make no
// model (no layers or experts, max_sequences < 1, streaming without a storage bandwidth).
Status plan_batch(const BatchPlanInputs& in, BatchPlan* out);

// The plan as one JSON object (its inputs' key facts, the choice, the reason and every row).
std::string batch_plan_json(const BatchPlanInputs& in, const BatchPlan& plan);

}  // namespace moelite
