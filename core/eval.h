// Per-context evaluation state: the KV cache and the scratch activations of one forward pass.
#pragma once
#include <vector>

#include "backends/backend.h"
#include "moelite.h"

namespace moelite {

struct EvalState {
  Backend* backend = nullptr;
  KvCache kv;
  int32_t n_batch = 0;          // rows allocated in each scratch Act
  // The batch being computed.
  int32_t n_tokens = 0;
  int32_t pos0 = 0;
  std::vector<int32_t> positions;
  // Scratch, n_batch rows each; layers use views of the first n_tokens rows.
  Act x, xn, q, k, v, attn, proj, router_logits, moe_out, shared_out, head_out;
  Routing routing;
  moelite_routing_fn on_route = nullptr;  // observer of every layer's routing (may be null)
  void* route_user = nullptr;

  Act rows(const Act& a) const { return backend->view_rows(a, 0, n_tokens); }
};

}  // namespace moelite
