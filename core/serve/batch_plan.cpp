#include "core/serve/batch_plan.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "core/experts/trace_replay.h"
#include "core/moe/tokens_by_expert.h"

namespace moelite {

const char* plan_pools_name(bool resident, bool per_layer) {
  return resident ? "none" : per_layer ? "uniform" : "global";
}

namespace {

// a - b - c ..., saturating at 0.
uint64_t left_after(uint64_t total, std::initializer_list<uint64_t> takes) {
  for (uint64_t t : takes) total = total > t ? total - t : 0;
  return total;
}

std::string mib(double bytes) {
  char buf[48];
  snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// The chance that a decode step of n sequences (one token each) uses each expert: per layer and
// expert, 1 - (1 - p)^n, p the share of tokens routed to it (k / E when routing is taken as uniform).
struct StepAccess {
  std::vector<double> access;  // n_moe_layers x n_expert (empty: uniform routing)
  double uniform = 0;          // each expert's chance under uniform routing
  double distinct = 0;         // their sum: the distinct experts a step uses, all layers

  // Expected LRU hits of a cache of `capacity` slots over the experts [first, first + count).
  double hits(size_t first, size_t count, double capacity) const;
};

// With uniform routing every expert has the same chance: `access` stays empty and `uniform` holds it.
StepAccess step_access(const BatchPlanInputs& in, int32_t n) {
  StepAccess s;
  const size_t cells = static_cast<size_t>(in.n_moe_layers) * static_cast<size_t>(in.n_expert);
  if (in.routing.empty()) {
    s.uniform = expected_distinct_experts(in.n_expert, in.n_expert_used, n) / in.n_expert;
    s.distinct = s.uniform * static_cast<double>(cells);
    return s;
  }
  s.access.resize(cells);
  for (size_t i = 0; i < cells; ++i) {
    s.access[i] = 1.0 - std::pow(1.0 - std::clamp(in.routing[i], 0.0, 1.0), n);
    s.distinct += s.access[i];
  }
  return s;
}

// Expected hits per step of an LRU cache of `capacity` slots over items used in each step with
// probabilities a[i], independently (Che's approximation: the cache holds what was used within the
// last T steps, T such that the expected number of such items is the capacity; an item then hits
// with probability 1 - (1 - a)^T). Uniform a gives capacity / items of the uses, as it should.
double lru_hits(const double* a, int32_t items, double capacity) {
  double used = 0, present = 0;
  for (int32_t i = 0; i < items; ++i) {
    used += a[i];
    present += a[i] > 0 ? 1 : 0;
  }
  if (capacity >= present) return used;  // everything ever used stays
  if (capacity <= 0) return 0.0;
  auto held = [&](double t) {
    double h = 0;
    for (int32_t i = 0; i < items; ++i) h += a[i] >= 1.0 ? 1.0 : 1.0 - std::exp(t * std::log1p(-a[i]));
    return h;
  };
  double lo = 0, hi = 1;
  while (held(hi) < capacity && hi < 1e12) hi *= 2;
  for (int iter = 0; iter < 64; ++iter) {  // halves [0, hi] to double precision
    const double mid = 0.5 * (lo + hi);
    (held(mid) < capacity ? lo : hi) = mid;
  }
  double hits = 0;
  for (int32_t i = 0; i < items; ++i)
    hits += a[i] * (a[i] >= 1.0 ? 1.0 : 1.0 - std::exp(hi * std::log1p(-a[i])));
  return hits;
}

double StepAccess::hits(size_t first, size_t count, double capacity) const {
  if (!access.empty()) return lru_hits(access.data() + first, static_cast<int32_t>(count), capacity);
  // Equal chances: the cache holds `capacity` of the `count` experts, each hit with the same chance.
  return uniform * std::clamp(capacity, 0.0, static_cast<double>(count));
}

// The decode steps of n sequences that each follow the recorded routing, sequence i from token
// i * tokens / n on (wrapping around): per step and MoE layer one entry, the union of the
// sequences' experts (the step reads each once); the steps twice over, the first pass to warm
// the cache.
struct ReplayedSteps {
  Trace twice;
  size_t warmup = 0;    // entries of the first pass
  double distinct = 0;  // experts a step reads, all layers together, on average
  size_t largest = 0;   // the most experts one layer of one step reads
};

// Steps to replay for n of at most `candidates` sequences: kMaxReplayWork shared evenly by the
// candidates, a step of n sequences costing about n k L E (see kMaxReplayWork).
int32_t replayed_step_count(const BatchPlanInputs& in, int32_t n) {
  const double per_step = static_cast<double>(n) * in.n_expert_used * in.n_moe_layers * in.n_expert;
  const double affordable = kMaxReplayWork / std::max(1, in.max_sequences) / std::max(1.0, per_step);
  return static_cast<int32_t>(std::clamp(std::floor(affordable), 1.0,
                                         static_cast<double>(std::min(in.trace->tokens, kMaxReplayedSteps))));
}

ReplayedSteps replayed_steps(const RoutingTrace& rt, int32_t n_layers, int32_t n_expert, int32_t n, int32_t steps) {
  ReplayedSteps r;
  Trace& t = r.twice;
  t.n_layers = n_layers;
  t.n_experts = n_expert;
  t.entries.reserve(2 * static_cast<size_t>(steps) * static_cast<size_t>(n_layers));
  std::vector<uint8_t> taken(static_cast<size_t>(n_expert));
  size_t reads = 0;
  for (int32_t s = 0; s < steps; ++s)
    for (int32_t l = 0; l < n_layers; ++l) {
      TraceEntry e;
      e.token = s;
      e.layer = l;
      std::fill(taken.begin(), taken.end(), 0);
      for (int32_t i = 0; i < n; ++i) {
        const int64_t token = (static_cast<int64_t>(i) * rt.tokens / n + s) % rt.tokens;
        for (int32_t x : rt.experts[static_cast<size_t>(token * n_layers + l)])
          if (!taken[static_cast<size_t>(x)]) {
            taken[static_cast<size_t>(x)] = 1;
            e.experts.push_back(x);
          }
      }
      reads += e.experts.size();
      r.largest = std::max(r.largest, e.experts.size());
      t.entries.push_back(std::move(e));
    }
  t.top_k = static_cast<int32_t>(r.largest);
  r.distinct = steps > 0 ? static_cast<double>(reads) / steps : 0.0;
  r.warmup = t.entries.size();
  for (size_t i = 0; i < r.warmup; ++i) {
    t.entries.push_back(t.entries[i]);
    t.entries.back().token += steps;
  }
  return r;
}

// The steady-state LRU hit share of the replayed steps: the second pass's hits over its accesses
// (the first pass warms the cache). Per-layer pools of `capacity` slots each (a share of slots:
// interpolated between whole ones), or one global pool of `capacity` slots (hits nothing where one
// layer-step alone outnumbers it).
Status replayed_hit_share(const ReplayedSteps& steps, bool per_layer, double capacity, double* out) {
  *out = 0.0;
  if (!per_layer) {
    const int64_t slots = static_cast<int64_t>(std::floor(capacity));
    if (slots < static_cast<int64_t>(std::max<size_t>(steps.largest, 1))) return MOELITE_OK;
    ReplayResult second;
    MOELITE_TRY(replay(steps.twice, "lru", slots, true, &second, PolicyOptions{}, steps.warmup));
    *out = second.accesses ? second.hit_rate() : 1.0;
    return MOELITE_OK;
  }
  std::vector<std::vector<double>> rates;  // [layer][slots]: hit rates of the second pass's accesses
  std::vector<uint64_t> accesses;          // of the second pass, per layer
  MOELITE_TRY(lru_hit_curves(steps.twice, &rates, steps.warmup, &accesses));
  const size_t E = static_cast<size_t>(steps.twice.n_experts);
  const double c = std::clamp(capacity, 0.0, static_cast<double>(E));
  const size_t lo = static_cast<size_t>(std::floor(c)), hi = std::min(lo + 1, E);
  const double frac = c - static_cast<double>(lo);
  double hits = 0, all = 0;
  for (size_t l = 0; l < rates.size(); ++l) {
    const double n = static_cast<double>(accesses[l]);
    hits += n * ((1.0 - frac) * rates[l][lo] + frac * rates[l][hi]);
    all += n;
  }
  *out = all > 0 ? std::clamp(hits / all, 0.0, 1.0) : 1.0;
  return MOELITE_OK;
}

Status check_trace(const BatchPlanInputs& in) {
  const RoutingTrace& t = *in.trace;
  if (t.tokens < 1 || t.experts.size() != static_cast<size_t>(t.tokens) * static_cast<size_t>(in.n_moe_layers))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "batch plan: the routing trace has %zu layer entries for %d tokens of %d layers",
                t.experts.size(), t.tokens, in.n_moe_layers);
  for (const std::vector<int32_t>& ids : t.experts)
    for (int32_t x : ids)
      if (x < 0 || x >= in.n_expert)
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "batch plan: the routing trace names expert %d of %d", x, in.n_expert);
  return MOELITE_OK;
}

}  // namespace

namespace {

Status check_plan_inputs(const BatchPlanInputs& in) {
  if (in.n_moe_layers <= 0 || in.n_expert <= 0 || in.n_expert_used <= 0 || in.slot_bytes == 0)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "batch plan: the model has no routed experts to plan for");
  if (in.max_sequences < 1 || in.min_sequences < 1 || in.min_sequences > in.max_sequences)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "batch plan: %d..%d sequences is not a range within 1..", in.min_sequences,
                in.max_sequences);
  if (!in.resident && !(in.storage_bytes_per_s > 0))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "batch plan: streaming experts needs the storage read bandwidth");
  if (in.routing.size() > kMaxRoutingCells)
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "batch plan: routing shares for %zu experts; the planner models at most %zu (with uniform routing, any)",
                in.routing.size(), kMaxRoutingCells);
  if (!in.routing.empty() &&
      in.routing.size() != static_cast<size_t>(in.n_moe_layers) * static_cast<size_t>(in.n_expert))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "batch plan: routing shares for %zu experts, the model has %d x %d",
                in.routing.size(), in.n_moe_layers, in.n_expert);
  if (in.compute_bytes_per_s < 0 || std::isnan(in.compute_bytes_per_s))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "batch plan: the compute rate must be >= 0");
  if (in.trace) MOELITE_TRY(check_trace(in));

  return MOELITE_OK;
}

// The prediction for n sequences decoding together: memory, pools, hits, reads and time of a step.
Status predict_row(const BatchPlanInputs& in, int32_t n, BatchPlanRow* out) {
  const double L = in.n_moe_layers, E = in.n_expert;
  BatchPlanRow r;
  r.n_seq = n;
  r.kv_bytes = in.kv_per_sequence * static_cast<uint64_t>(n);
  const uint64_t taken = in.dense + in.context_base + r.kv_bytes + in.headroom;
  const uint64_t cache_room = in.memory > taken ? in.memory - taken : 0;
  uint64_t cache_bytes;  // what the experts take in memory
  if (in.resident) {
    cache_bytes = 0;  // mapped: the page cache's, not counted (nor are mapped dense weights: pass dense = 0)
    r.fits = in.memory >= taken;
  } else if (in.fixed_budget > 0) {
    cache_bytes = std::min(in.fixed_budget, in.all_experts);
    r.fits = in.memory >= taken && cache_room >= cache_bytes;
  } else {
    cache_bytes = std::min(cache_room, in.all_experts);
  }
  r.expert_budget = in.resident ? 0 : cache_bytes;
  const double slots = std::floor(static_cast<double>(cache_bytes) / static_cast<double>(in.slot_bytes));
  // The step's experts by the independent model (the shares), or measured on the trace.
  const StepAccess step = in.trace ? StepAccess{} : step_access(in, n);
  ReplayedSteps replayed;
  if (in.trace) replayed = replayed_steps(*in.trace, in.n_moe_layers, in.n_expert, n, replayed_step_count(in, n));
  const double distinct = in.trace ? replayed.distinct : step.distinct;
  r.distinct_experts = distinct / L;
  // One global pool where a step's experts fit in it (or where the caller says so), else a pool per layer.
  const bool step_fits_globally = slots - 1.0 >= distinct;
  r.per_layer = !in.resident && (in.pools == CachePools::kPerLayer ||
                                 (in.pools == CachePools::kChoose && !step_fits_globally));
  const double reserve_slots = r.per_layer ? L : 1.0;
  r.cache_share = in.resident ? 1.0 : std::clamp((slots - reserve_slots) / (L * E), 0.0, 1.0);
  if (in.resident) {
    r.hit_share = 1.0;
  } else if (in.trace) {
    const double capacity = r.per_layer ? std::max(0.0, (slots - reserve_slots) / L) : slots - reserve_slots;
    MOELITE_TRY(replayed_hit_share(replayed, r.per_layer, capacity, &r.hit_share));
  } else if (r.per_layer) {
    double hits = 0;  // each layer's pool holds its share of the slots
    for (int32_t l = 0; l < in.n_moe_layers; ++l)
      hits += step.hits(static_cast<size_t>(l) * static_cast<size_t>(in.n_expert), static_cast<size_t>(in.n_expert),
                        std::max(0.0, (slots - reserve_slots) / L));
    r.hit_share = step.distinct > 0 ? hits / step.distinct : 1.0;
  } else if (step_fits_globally) {
    const size_t all = static_cast<size_t>(in.n_moe_layers) * static_cast<size_t>(in.n_expert);
    r.hit_share = step.distinct > 0 ? step.hits(0, all, slots - reserve_slots) / step.distinct : 1.0;
  } else {
    r.hit_share = 0.0;  // a cyclic scan larger than the pool
  }
  if (!in.resident && in.fixed_budget == 0)
    r.fits = in.memory >= taken && cache_bytes >= (r.per_layer ? in.minimum_per_layer : in.minimum_budget);
  const double step_expert_bytes = distinct * static_cast<double>(in.slot_bytes);
  r.read_bytes = step_expert_bytes * (1.0 - r.hit_share);
  r.read_seconds = r.read_bytes > 0 ? r.read_bytes / in.storage_bytes_per_s : 0.0;
  r.compute_seconds =
      in.compute_bytes_per_s > 0 ? (static_cast<double>(in.dense) + step_expert_bytes) / in.compute_bytes_per_s : 0.0;
  r.step_seconds = r.read_seconds + r.compute_seconds;
  r.tok_s = r.step_seconds > 0 ? n / r.step_seconds : 0.0;
  *out = r;
  return MOELITE_OK;
}

// One sentence: what bounded the choice of `chosen` (`best`: the row of the best throughput).
std::string explain_choice(const BatchPlanInputs& in, const BatchPlan& plan, int32_t chosen, int32_t best) {
  const BatchPlanRow& c = plan.rows[static_cast<size_t>(chosen)];
  std::string why;
  if (in.min_sequences == in.max_sequences)
    why = std::to_string(c.n_seq) + " sequence" + (c.n_seq == 1 ? "" : "s") + " asked for";
  else if (c.n_seq == in.max_sequences)
    why = "all " + std::to_string(in.max_sequences) + " sequences asked for fit";
  else if (chosen != best)
    why = std::to_string(c.n_seq) + " sequences are within " + std::to_string(int(kNearBest * 100)) +
          " % of the best predicted throughput (" + std::to_string(best + 1) + ")";
  else if (!plan.rows[static_cast<size_t>(chosen) + 1].fits)
    why = "no more sequences' KV caches fit in the memory";
  else
    why = "more sequences' KV caches would shrink the expert cache more than they share reads";
  if (!in.resident && in.pools == CachePools::kChoose)
    why += c.per_layer ? "; a pool per layer: a step's experts outnumber the slots, and one LRU pool would evict each "
                         "layer's experts before the next step reuses them"
                       : "; one global pool: a step's experts fit in it";
  if (!in.resident && in.fixed_budget == 0)
    why += "; experts get " + mib(static_cast<double>(c.expert_budget)) + " (" +
           std::to_string(static_cast<int>(std::lround(c.cache_share * 100))) + " % of them)";
  if (c.read_seconds > 0)
    why += c.compute_seconds <= 0 ? "; lookahead 0: no compute rate to compare reads with"
           : plan.lookahead ? "; lookahead 1: a step's reads fit behind its computation"
                            : "; lookahead 0: a step's reads take longer than its computation, guesses would add reads";
  return why;
}

}  // namespace

Status plan_batch(const BatchPlanInputs& in, BatchPlan* out) {
  MOELITE_TRY(check_plan_inputs(in));
  BatchPlan plan;
  plan.rows.reserve(static_cast<size_t>(in.max_sequences));
  int32_t best = -1;  // row index of the best score
  double best_score = -1.0;
  for (int32_t n = 1; n <= in.max_sequences; ++n) {
    BatchPlanRow r;
    MOELITE_TRY(predict_row(in, n, &r));
    plan.rows.push_back(r);
    if (!r.fits || n < in.min_sequences) continue;
    // Nothing to time (no reads, no compute rate): more sequences share more, so larger n scores higher.
    const double score = r.step_seconds > 0 ? r.tok_s : 1e300 * (n / static_cast<double>(in.max_sequences));
    if (score > best_score) {
      best_score = score;
      best = n - 1;
    }
  }
  if (best < 0) {
    const BatchPlanRow& one = plan.rows[static_cast<size_t>(in.min_sequences) - 1];
    return fail(MOELITE_ERR_BUDGET_TOO_SMALL,
                "batch plan: %" PRIu64 " bytes of memory - %" PRIu64 " dense weights - %" PRIu64
                " context scratch - %" PRIu64 " KV cache of %d sequence%s - %" PRIu64 " headroom leave %" PRIu64
                " bytes for experts; they need %" PRIu64,
                in.memory, in.dense, in.context_base, one.kv_bytes, one.n_seq, one.n_seq == 1 ? "" : "s", in.headroom,
                left_after(in.memory, {in.dense, in.context_base, one.kv_bytes, in.headroom}),
                in.resident ? 0 : in.fixed_budget > 0 ? in.fixed_budget : in.minimum_budget);
  }
  // The fewest sequences within kNearBest of the best.
  int32_t chosen = best;
  if (plan.rows[static_cast<size_t>(best)].tok_s > 0)
    for (int32_t i = in.min_sequences - 1; i < best; ++i) {
      const BatchPlanRow& r = plan.rows[static_cast<size_t>(i)];
      if (r.fits && r.tok_s >= (1.0 - kNearBest) * plan.rows[static_cast<size_t>(best)].tok_s) {
        chosen = i;
        break;
      }
    }
  const BatchPlanRow& c = plan.rows[static_cast<size_t>(chosen)];
  plan.n_seq = c.n_seq;
  plan.expert_budget = c.expert_budget;
  plan.kv_bytes = c.kv_bytes;
  plan.tok_s = c.tok_s;
  plan.per_layer = c.per_layer;
  plan.lookahead = c.read_seconds > 0 && c.compute_seconds > 0 && c.read_seconds <= c.compute_seconds ? 1 : 0;
  plan.reason = explain_choice(in, plan, chosen, best);
  *out = std::move(plan);
  return MOELITE_OK;
}

std::string batch_plan_json(const BatchPlanInputs& in, const BatchPlan& plan) {
  std::string s;
  char buf[512];
  snprintf(buf, sizeof buf,
           "{\"n_seq\": %d, \"expert_budget_bytes\": %" PRIu64 ", \"kv_bytes\": %" PRIu64
           ", \"lookahead\": %d, \"allocation\": \"%s\", \"predicted_decode_tok_s\": %.4g, \"memory_bytes\": %" PRIu64
           ", \"dense_bytes\": %" PRIu64 ", \"context_base_bytes\": %" PRIu64 ", \"kv_bytes_per_sequence\": %" PRIu64
           ", \"headroom_bytes\": %" PRIu64 ", \"slot_bytes\": %" PRIu64 ", \"resident\": %s, \"fixed_budget\": %s, \"storage_gb_s\": %.4g"
           ", \"compute_gb_s\": %.4g, \"routing\": \"%s\", \"reason\": \"",
           plan.n_seq, plan.expert_budget, plan.kv_bytes, plan.lookahead, plan_pools_name(in.resident, plan.per_layer),
           plan.tok_s, in.memory, in.dense, in.context_base,
           in.kv_per_sequence, in.headroom, in.slot_bytes, in.resident ? "true" : "false", in.fixed_budget > 0 ? "true" : "false",
           in.storage_bytes_per_s / 1e9, in.compute_bytes_per_s / 1e9, in.trace ? "trace" : in.routing.empty() ? "uniform" : "profile");
  s += buf;
  for (char ch : plan.reason) {  // plain text of this file's making: only quotes and backslashes to escape
    if (ch == '"' || ch == '\\') s += '\\';
    s += ch;
  }
  s += "\", \"rows\": [";
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const BatchPlanRow& r = plan.rows[i];
    snprintf(buf, sizeof buf,
             "%s{\"n_seq\": %d, \"fits\": %s, \"kv_bytes\": %" PRIu64 ", \"expert_budget_bytes\": %" PRIu64
             ", \"allocation\": \"%s\", \"cache_share\": %.4f, \"hit_share\": %.4f, \"distinct_experts_per_layer\": %.3f, \"read_bytes_per_step\": %.0f"
             ", \"step_seconds\": %.6g, \"decode_tok_s\": %.4g}",
             i ? ", " : "", r.n_seq, r.fits ? "true" : "false", r.kv_bytes, r.expert_budget,
             plan_pools_name(in.resident, r.per_layer), r.cache_share, r.hit_share,
             r.distinct_experts, r.read_bytes, r.step_seconds, r.tok_s);
    s += buf;
  }
  s += "]}";
  return s;
}

}  // namespace moelite
