// The expert budget: how much memory routed experts may occupy, as the user says it. One type for
// every way of saying it, parsed in one place (parse_expert_budget), so "25%" means the same from
// the CLI, the server, C, Python, Node and Rust. The memory plan (memory_plan.h) turns it into
// slots.
//
//   none     every expert stays in the file mapping (no store)
//   bytes    the slot pool never exceeds this many bytes
//   share    P % of the routed experts get a slot (beside the store's reserve): 100 % keeps every
//            expert, 25 % a quarter of them; in bytes, P % of what holding every expert takes
//   auto     sized at load from the memory left (budget_auto.h), with an optional headroom
#pragma once
#include <cstdint>
#include <string>

#include "base/status.h"

namespace moelite {

struct ExpertBudget {
  enum class Kind { None, Bytes, Share, Auto };
  Kind kind = Kind::None;
  uint64_t bytes = 0;     // Bytes
  double share = 0;       // Share, in (0, 1]
  uint64_t headroom = 0;  // Auto: memory left for everything else (0: the default)

  static ExpertBudget of_bytes(uint64_t bytes);  // 0: None
  static ExpertBudget of_share(double share);
  static ExpertBudget automatic(uint64_t headroom);
  bool streams() const { return kind != Kind::None; }
  // "none", "2.0 GiB", "25%", "auto" (with its headroom when one was given).
  std::string describe() const;
};

// Most bytes a budget or headroom may name (2^62): beyond, arithmetic on it could overflow.
constexpr uint64_t kMaxBudgetBytes = uint64_t{1} << 62;

// A size in bytes: digits with an optional fraction and unit (B, K/KB = 1000, KiB = 1024, M, MB,
// MiB, G, GB, GiB, T, TB, TiB): "2GiB", "1.5G", "123456". MOELITE_ERR_INVALID_ARGUMENT saying what
// was expected, for anything else, below one byte or above kMaxBudgetBytes.
Status parse_size(const std::string& text, uint64_t* out);

// "none" | a size (parse_size) | "P%" with 0 < P <= 100 | "auto". "0" is refused rather than
// taken for "none": a budget that computed to zero bytes must not silently mean every expert resident.
Status parse_expert_budget(const std::string& text, ExpertBudget* out);

}  // namespace moelite
