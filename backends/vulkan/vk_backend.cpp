#include "backends/vulkan/vk_backend.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>

namespace moelite::vk {

namespace {

constexpr uint32_t kGroup = 64;           // local size of the element-wise shaders
constexpr uint32_t kMaxGroupsX = 65535;   // the guaranteed maxComputeWorkGroupCount[0]

uint32_t groups_for(uint64_t n) { return static_cast<uint32_t>((n + kGroup - 1) / kGroup); }

bool computable(TensorType t) {
  switch (t) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: case TensorType::Q4_0: case TensorType::Q4_1:
    case TensorType::Q5_0: case TensorType::Q5_1: case TensorType::Q8_0: case TensorType::Q2_K: case TensorType::Q3_K:
    case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K:
      return true;
    default:
      return false;
  }
}

}  // namespace

Status VulkanBackend::create(bool allow_cpu, std::unique_ptr<Backend>* out) {
  std::unique_ptr<Device> dev;
  MOELITE_TRY(Device::create(allow_cpu, &dev));
  std::unique_ptr<VulkanBackend> b(new VulkanBackend(std::move(dev)));
  MOELITE_TRY(b->dev_->alloc(16, &b->dummy_));
  *out = std::move(b);
  return MOELITE_OK;
}

VulkanBackend::VulkanBackend(std::unique_ptr<Device> dev) : dev_(std::move(dev)) {
  name_ = "vulkan (" + dev_->facts().name + ")";
}

VulkanBackend::~VulkanBackend() {
  dev_->flush();
  for (Shared& sh : shared_) dev_->free(&sh.buf);
  for (TierSlot& t : tier_)
    for (Buffer& b : t.chunk) dev_->free(&b);
  if (!tier_.empty())
    log_msg(MOELITE_LOG_INFO, "vulkan: device expert tier: %" PRIu64 " hits, %" PRIu64 " loads over the transfer queue", tier_hits_, tier_loads_);
  auto free_weight = [&](DevWeight& w) {
    for (auto& c : w.chunks) dev_->free(&c.buf);
  };
  for (auto& w : placed_) free_weight(*w);
  for (auto& kv : weight_cache_) free_weight(*kv.second);
  for (auto& kv : float_cache_) dev_->free(&kv.second);
  dev_->free(&scores_);
  dev_->free(&ffn_out_);
  dev_->free(&dummy_);
}

void VulkanBackend::remember(Status st) {
  if (st != MOELITE_OK && error_ == MOELITE_OK) error_ = st;
}

// ---- memory

void* VulkanBackend::alloc_shared(uint64_t bytes) {
  // Only where device memory is the host's, and within one storage buffer (beyond it the store
  // keeps ordinary memory and experts are copied in).
  constexpr uint64_t kAlign = 4096;  // direct I/O lands in the slots
  if (!dev_->facts().unified_memory || bytes + kAlign > dev_->facts().max_storage_range) return nullptr;
  Shared sh;
  if (dev_->alloc(bytes + kAlign, &sh.buf) != MOELITE_OK || !sh.buf.mapped) {
    clear_error();
    if (sh.buf.buffer) dev_->free(&sh.buf);
    return nullptr;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(sh.buf.mapped);
  sh.host = reinterpret_cast<uint8_t*>((base + kAlign - 1) / kAlign * kAlign);
  sh.bytes = bytes;
  shared_.push_back(sh);
  return sh.host;
}

void VulkanBackend::free_shared(void* p) {
  for (auto it = shared_.begin(); it != shared_.end(); ++it)
    if (it->host == p) {
      dev_->flush();
      dev_->free(&it->buf);
      shared_.erase(it);
      return;
    }
}

const VulkanBackend::DevWeight* VulkanBackend::shared_weight(const WeightView& w) {
  for (const Shared& sh : shared_) {
    if (w.data < sh.host || w.data + w.row_bytes * static_cast<uint64_t>(w.rows) > sh.host + sh.bytes) continue;
    auto dw = std::make_unique<DevWeight>();
    dw->type = w.type;
    dw->row_bytes = w.row_bytes;
    dw->cols = w.cols;
    DevWeight::Chunk c;
    c.buf = sh.buf;
    c.offset = static_cast<uint64_t>(w.data - static_cast<const uint8_t*>(sh.buf.mapped));
    c.rows = w.rows;
    dw->chunks.push_back(c);
    temp_weights_.push_back(std::move(dw));
    return temp_weights_.back().get();
  }
  return nullptr;
}

bool VulkanBackend::tier_expert(int32_t layer, int32_t expert, const ExpertWeights& w, int64_t pool_slots,
                                const DevWeight* out[3]) {
  if (tier_.empty()) {
    tier_.resize(static_cast<size_t>(std::max<int64_t>(pool_slots, 2)));
    log_msg(MOELITE_LOG_INFO, "vulkan: device expert tier of %zu slots", tier_.size());
  }
  TierSlot* slot = nullptr;
  for (TierSlot& t : tier_)
    if (t.layer == layer && t.expert == expert) slot = &t;
  const WeightView* views[3] = {&w.gate, &w.up, &w.down};
  if (slot) {
    ++tier_hits_;
  } else {
    // The least recently used slot that no unsubmitted work reads.
    for (TierSlot& t : tier_)
      if (!t.in_use && (!slot || t.last_use < slot->last_use)) slot = &t;
    if (!slot) {
      remember(dev_->flush());  // every slot is read by recorded work: run it first
      for (TierSlot& t : tier_) t.in_use = false;
      slot = &tier_[0];
    }
    ++tier_loads_;
    slot->layer = layer;
    slot->expert = expert;
    for (int c = 0; c < 3; ++c) {
      const uint64_t bytes = views[c]->row_bytes * static_cast<uint64_t>(views[c]->rows);
      if (slot->chunk[c].size < (bytes + 3) / 4 * 4) {
        dev_->free(&slot->chunk[c]);
        Status st = dev_->alloc_device((bytes + 3) / 4 * 4, &slot->chunk[c]);
        remember(st);
        if (st != MOELITE_OK) {
          slot->layer = -1;
          return false;
        }
      }
      Status st = dev_->transfer(slot->chunk[c], views[c]->data, bytes);
      remember(st);
      if (st != MOELITE_OK) {
        slot->layer = -1;
        return false;
      }
    }
  }
  slot->last_use = ++tier_clock_;
  slot->in_use = true;
  for (int c = 0; c < 3; ++c) {
    auto dw = std::make_unique<DevWeight>();
    dw->type = views[c]->type;
    dw->row_bytes = views[c]->row_bytes;
    dw->cols = views[c]->cols;
    DevWeight::Chunk ch;
    ch.buf = slot->chunk[c];
    ch.rows = views[c]->rows;
    dw->chunks.push_back(ch);
    temp_weights_.push_back(std::move(dw));
    out[c] = temp_weights_.back().get();
  }
  return true;
}

Status VulkanBackend::check_weight(const WeightView& w) {
  if (!computable(w.type))
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "the Vulkan backend has no kernels for weight type %s", type_name(w.type));
  return MOELITE_OK;
}

Status VulkanBackend::upload_weight(const WeightView& w, Keep keep, DevWeight** out) {
  MOELITE_TRY(check_weight(w));
  auto dw = std::make_unique<DevWeight>();
  dw->type = w.type;
  dw->row_bytes = w.row_bytes;
  dw->cols = w.cols;
  // Rows per chunk: as many as fit the storage-buffer range (whole rows, 4-byte aligned starts).
  const uint64_t limit = std::min<uint64_t>(dev_->facts().max_storage_range, uint64_t{1} << 31);
  const int64_t per_chunk = std::max<int64_t>(1, static_cast<int64_t>(limit / w.row_bytes));
  for (int64_t r0 = 0; r0 < w.rows; r0 += per_chunk) {
    DevWeight::Chunk c;
    c.row0 = r0;
    c.rows = std::min(per_chunk, w.rows - r0);
    const uint64_t bytes = static_cast<uint64_t>(c.rows) * w.row_bytes;
    const uint8_t* src = w.data + static_cast<uint64_t>(r0) * w.row_bytes;
    if (keep != Keep::Temporary) {
      MOELITE_TRY(dev_->alloc((bytes + 3) / 4 * 4, &c.buf));  // shaders read whole 32-bit words
      MOELITE_TRY(dev_->write_new(c.buf, src, bytes));
    } else {
      MOELITE_TRY(dev_->temp(src, bytes, &c.buf));
    }
    dw->chunks.push_back(c);
  }
  *out = dw.get();
  if (keep == Keep::Placed) placed_.push_back(std::move(dw));
  else if (keep == Keep::Cached) weight_cache_[w.data] = std::move(dw);
  else temp_weights_.push_back(std::move(dw));
  return MOELITE_OK;
}

Status VulkanBackend::place_weight(WeightView* w) {
  if (!w->data) return fail(MOELITE_ERR_INTERNAL, "vulkan: a weight to place has no host bytes");
  DevWeight* dw;
  MOELITE_TRY(upload_weight(*w, Keep::Placed, &dw));
  w->device = dw;
  return MOELITE_OK;
}

const VulkanBackend::DevWeight* VulkanBackend::device_weight(const WeightView& w, bool keep) {
  if (w.device) return static_cast<const DevWeight*>(w.device);
  if (const DevWeight* sw = shared_weight(w)) return sw;
  auto it = weight_cache_.find(w.data);
  if (it != weight_cache_.end()) return it->second.get();
  DevWeight* dw = nullptr;
  const Status st = upload_weight(w, keep ? Keep::Cached : Keep::Temporary, &dw);
  remember(st);
  return st == MOELITE_OK ? dw : nullptr;
}

const Buffer& VulkanBackend::host_floats(const float* p, size_t n) {
  if (!p) return dummy_;
  auto it = float_cache_.find(p);
  if (it != float_cache_.end()) return it->second;
  Buffer b;
  Status st = dev_->alloc(n * sizeof(float), &b);
  if (st == MOELITE_OK) st = dev_->write_new(b, p, n * sizeof(float));
  remember(st);
  return st == MOELITE_OK ? (float_cache_[p] = b) : dummy_;
}

Status VulkanBackend::alloc_act(int64_t rows, int64_t cols, Act* out) {
  auto a = std::make_unique<ActRef>();
  MOELITE_TRY(dev_->alloc(static_cast<uint64_t>(rows * cols) * sizeof(float), &a->buf));
  a->base = a.get();
  *out = {a.release(), rows, cols};
  return MOELITE_OK;
}

void VulkanBackend::free_act(Act* a) {
  ActRef* r = ref(*a);
  if (!r) return;
  dev_->flush();
  for (auto it = views_.begin(); it != views_.end();) it = it->first.first == r ? views_.erase(it) : std::next(it);
  dev_->free(&r->buf);
  delete r;
  a->handle = nullptr;
}

Act VulkanBackend::view_rows(const Act& a, int64_t row0, int64_t n) {
  ActRef* r = ref(a);
  const uint64_t off = r->off + static_cast<uint64_t>(row0 * a.cols);
  if (off == r->off) return {r, n, a.cols};
  // Views are interned: their number is bounded by the distinct row offsets used.
  auto& v = views_[{r->base, off}];
  if (!v) v.reset(new ActRef{r->buf, off, r->base});
  return {v.get(), n, a.cols};
}

void VulkanBackend::read_rows(const Act& a, int64_t row0, int64_t n, float* dst) {
  const ActRef* r = ref(a);
  remember(dev_->download(r->buf, (r->off + static_cast<uint64_t>(row0 * a.cols)) * sizeof(float), dst,
                          static_cast<uint64_t>(n * a.cols) * sizeof(float)));
}

Status VulkanBackend::alloc_kv(int32_t n_layers, int32_t n_ctx, int64_t kv_dim, KvCache* out) {
  auto kv = std::make_unique<KvRef>();
  for (int32_t l = 0; l < n_layers; ++l) {
    Buffer b;
    const Status st = dev_->alloc(2ull * static_cast<uint64_t>(n_ctx) * static_cast<uint64_t>(kv_dim) * sizeof(float), &b);
    if (st != MOELITE_OK) {
      for (Buffer& x : kv->layers) dev_->free(&x);
      return st;
    }
    kv->layers.push_back(b);
  }
  *out = {kv.release(), n_layers, n_ctx, kv_dim};
  return MOELITE_OK;
}

void VulkanBackend::free_kv(KvCache* kv) {
  auto* r = static_cast<KvRef*>(kv->handle);
  if (!r) return;
  dev_->flush();
  for (Buffer& b : r->layers) dev_->free(&b);
  delete r;
  kv->handle = nullptr;
}

// ---- operations

void VulkanBackend::get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) {
  const DevWeight* w = device_weight(table, true);
  if (!w) return;
  const ActRef* o = ref(*out);
  struct { uint32_t w_off, row_bytes, cols, y_off, y_stride; } pc{0, static_cast<uint32_t>(w->row_bytes),
                                                                  static_cast<uint32_t>(w->cols), 0,
                                                                  static_cast<uint32_t>(out->cols)};
  // One dispatch per chunk the tokens' rows lie in (one chunk unless the table was split).
  for (const auto& c : w->chunks) {
    for (int32_t t = 0; t < n; ++t) {
      if (tokens[t] < c.row0 || tokens[t] >= c.row0 + c.rows) continue;
      const bool whole = w->chunks.size() == 1;
      std::vector<int32_t> ids;
      if (whole) ids.assign(tokens, tokens + n);
      else ids.push_back(tokens[t] - static_cast<int32_t>(c.row0));
      Buffer ib;
      const Status st = dev_->temp(ids.data(), ids.size() * sizeof(int32_t), &ib);
      remember(st);
      if (st != MOELITE_OK) return;
      pc.w_off = static_cast<uint32_t>(c.offset);
      pc.y_off = static_cast<uint32_t>(o->off + (whole ? 0 : static_cast<uint64_t>(t) * static_cast<uint64_t>(out->cols)));
      dev_->dispatch("get_rows", static_cast<uint32_t>(w->type), {{&c.buf}, {&ib}, {&o->buf}}, &pc, sizeof pc,
                     groups_for(static_cast<uint64_t>(w->cols)), static_cast<uint32_t>(ids.size()));
      if (whole) return;
    }
  }
}

void VulkanBackend::rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) {
  const ActRef *xr = ref(x), *o = ref(*out);
  const Buffer& wb = host_floats(w, static_cast<size_t>(group));
  struct { uint32_t x_off, y_off, cols, group, has_w; float eps; } pc{
      static_cast<uint32_t>(xr->off), static_cast<uint32_t>(o->off), static_cast<uint32_t>(x.cols), static_cast<uint32_t>(group),
      w ? 1u : 0u, eps};
  dev_->dispatch("rms_norm", 0, {{&xr->buf}, {&o->buf}, {&wb}}, &pc, sizeof pc,
                 static_cast<uint32_t>(x.rows * (x.cols / group)));
}

void VulkanBackend::matmul_dev(const DevWeight& w, const Buffer& x, uint64_t x_off, uint64_t x_stride, const Buffer& y,
                               uint64_t y_off, uint64_t y_stride, int64_t n, const Buffer* bias, const Buffer* maps,
                               uint32_t map_n) {
  for (const auto& c : w.chunks) {
    for (int64_t r0 = 0; r0 < c.rows; r0 += kMaxGroupsX) {
      const uint32_t rows = static_cast<uint32_t>(std::min<int64_t>(kMaxGroupsX, c.rows - r0));
      struct { uint32_t w_off, row_bytes, cols, row0, x_off, x_stride, y_off, y_stride, flags, map_n, y_col0; } pc{
          static_cast<uint32_t>(c.offset), static_cast<uint32_t>(w.row_bytes), static_cast<uint32_t>(w.cols), static_cast<uint32_t>(r0),
          static_cast<uint32_t>(x_off), static_cast<uint32_t>(x_stride), static_cast<uint32_t>(y_off),
          static_cast<uint32_t>(y_stride), (bias ? 1u : 0u) | (maps ? 6u : 0u), map_n, static_cast<uint32_t>(c.row0)};
      dev_->dispatch(dev_->facts().use_subgroups ? "matmul_subgroup" : "matmul", static_cast<uint32_t>(w.type), {{&c.buf}, {&x}, {&y}, {bias ? bias : &dummy_}, {maps ? maps : &dummy_}},
                     &pc, sizeof pc, rows, static_cast<uint32_t>(n));
    }
  }
}

void VulkanBackend::matmul(const WeightView& w, const Act& x, const float* bias, Act* out) {
  const DevWeight* dw = device_weight(w, true);
  if (!dw) return;
  const ActRef *xr = ref(x), *o = ref(*out);
  const Buffer* b = bias ? &host_floats(bias, static_cast<size_t>(w.rows)) : nullptr;
  matmul_dev(*dw, xr->buf, xr->off, static_cast<uint64_t>(x.cols), o->buf, o->off, static_cast<uint64_t>(out->cols), x.rows, b,
             nullptr, 0);
}

void VulkanBackend::add(Act* x, const Act& y) {
  const ActRef *xr = ref(*x), *yr = ref(y);
  const uint64_t n = static_cast<uint64_t>(x->rows * x->cols);
  struct { uint32_t x_off, y_off, n, cols, mode; } pc{static_cast<uint32_t>(xr->off), static_cast<uint32_t>(yr->off),
                                                      static_cast<uint32_t>(n), static_cast<uint32_t>(x->cols), 0};
  dev_->dispatch("add", 0, {{&xr->buf}, {&yr->buf}}, &pc, sizeof pc, groups_for(n));
}

void VulkanBackend::rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) {
  // Angles in double on the host, as the CPU backend computes them.
  const int32_t half = p.n_rot / 2;
  std::vector<float> cs(static_cast<size_t>(x->rows) * static_cast<size_t>(half) * 2);
  for (int64_t t = 0; t < x->rows; ++t)
    for (int32_t i = 0; i < half; ++i) {
      const double theta = positions[t] * std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
      cs[static_cast<size_t>((t * half + i) * 2)] = static_cast<float>(std::cos(theta));
      cs[static_cast<size_t>((t * half + i) * 2 + 1)] = static_cast<float>(std::sin(theta));
    }
  Buffer angles;
  const Status st = dev_->temp(cs.data(), cs.size() * sizeof(float), &angles);
  remember(st);
  if (st != MOELITE_OK) return;
  const ActRef* xr = ref(*x);
  const uint64_t pairs = static_cast<uint64_t>(x->rows) * static_cast<uint64_t>(x->cols / head_dim) * static_cast<uint64_t>(half);
  struct { uint32_t x_off, cols, head_dim, n_rot, neox, n_pairs_total; } pc{
      static_cast<uint32_t>(xr->off), static_cast<uint32_t>(x->cols), static_cast<uint32_t>(head_dim),
      static_cast<uint32_t>(p.n_rot), p.style == RopeStyle::Neox ? 1u : 0u, static_cast<uint32_t>(pairs)};
  dev_->dispatch("rope", 0, {{&xr->buf}, {&angles}}, &pc, sizeof pc, groups_for(pairs));
}

void VulkanBackend::attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0,
                              int32_t n_head, int32_t n_head_kv, int64_t head_dim, Act* out) {
  const Buffer& cache = static_cast<KvRef*>(kv->handle)->layers[static_cast<size_t>(layer)];
  const uint64_t kv_dim = static_cast<uint64_t>(kv->kv_dim), n_ctx = static_cast<uint64_t>(kv->n_ctx);
  const ActRef *qr = ref(q), *kr = ref(k), *vr = ref(v), *o = ref(*out);
  const uint64_t n = static_cast<uint64_t>(q.rows);
  struct { uint32_t k_off, v_off, kv_dim, n, cache_k, cache_v; } st{
      static_cast<uint32_t>(kr->off), static_cast<uint32_t>(vr->off), static_cast<uint32_t>(kv_dim), static_cast<uint32_t>(n),
      static_cast<uint32_t>(static_cast<uint64_t>(pos0) * kv_dim), static_cast<uint32_t>((n_ctx + static_cast<uint64_t>(pos0)) * kv_dim)};
  dev_->dispatch("kv_store", 0, {{&kr->buf}, {&vr->buf}, {&cache}}, &st, sizeof st, groups_for(n * kv_dim));
  // Scores scratch: a chunk of tokens at a time, so any context length fits the storage range.
  const uint64_t per_token = static_cast<uint64_t>(n_head) * n_ctx * sizeof(float);
  const uint64_t chunk = std::max<uint64_t>(1, std::min<uint64_t>(n, (uint64_t{64} << 20) / per_token));
  if (scores_.size < chunk * per_token) {
    dev_->flush();
    dev_->free(&scores_);
    remember(dev_->alloc(chunk * per_token, &scores_));
    if (!scores_.buffer) return;
  }
  for (uint64_t t0 = 0; t0 < n; t0 += chunk) {
    const uint64_t m = std::min(chunk, n - t0);
    struct { uint32_t q_off, o_off, cache_k, cache_v, kv_dim, head_dim, n_head, n_head_kv, pos0, n_ctx; float scale; } pc{
        static_cast<uint32_t>(qr->off + t0 * static_cast<uint64_t>(q.cols)), static_cast<uint32_t>(o->off + t0 * static_cast<uint64_t>(out->cols)),
        0, static_cast<uint32_t>(n_ctx * kv_dim), static_cast<uint32_t>(kv_dim), static_cast<uint32_t>(head_dim),
        static_cast<uint32_t>(n_head), static_cast<uint32_t>(n_head_kv), static_cast<uint32_t>(pos0 + static_cast<int64_t>(t0)),
        static_cast<uint32_t>(n_ctx), 1.0f / std::sqrt(static_cast<float>(head_dim))};
    dev_->dispatch("attention", 0, {{&qr->buf}, {&cache}, {&o->buf}, {&scores_}}, &pc, sizeof pc,
                   static_cast<uint32_t>(m * static_cast<uint64_t>(n_head)));
  }
}

void VulkanBackend::route(const Act& logits, int32_t k, bool renormalize, Routing* r) {
  const uint64_t n = static_cast<uint64_t>(logits.rows), nk = n * static_cast<uint64_t>(k);
  r->n_tokens = static_cast<int32_t>(n);
  r->k = k;
  r->ids.assign(nk, 0);
  r->weights.assign(nk, 0.0f);
  // One buffer read back at once (a read-back releases the submission's temporaries): all ids,
  // then all weights.
  Buffer out;
  const Status st = dev_->temp(nullptr, 2 * nk * sizeof(float), &out);
  remember(st);
  if (st != MOELITE_OK) return;
  const ActRef* lr = ref(logits);
  struct { uint32_t l_off, n_expert, k, n, renorm; } pc{static_cast<uint32_t>(lr->off), static_cast<uint32_t>(logits.cols),
                                                        static_cast<uint32_t>(k), static_cast<uint32_t>(n), renormalize ? 1u : 0u};
  dev_->dispatch("route", 0, {{&lr->buf}, {&out}}, &pc, sizeof pc, groups_for(n));
  // Only the chosen experts come back.
  std::vector<uint32_t> host(2 * nk);
  remember(dev_->download(out, 0, host.data(), host.size() * sizeof(uint32_t)));
  memcpy(r->ids.data(), host.data(), nk * sizeof(int32_t));
  memcpy(r->weights.data(), host.data() + nk, nk * sizeof(float));
}

Status VulkanBackend::moe_ffn(int32_t layer, const Act& x, const Routing& r, ExpertSource* experts, Act* out) {
  MOELITE_TRY(error_);
  temp_weights_.clear();
  const int32_t n = r.n_tokens, k = r.k;
  const int64_t n_embd = x.cols;
  experts->on_routing(layer, r);
  const ExpertGroups groups(r);
  const std::vector<int32_t>& order = groups.order();

  // Per (token, slot) expert outputs, combined in slot order at the end (kept across the
  // submissions of a budgeted layer, so not a temporary).
  const uint64_t y_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(n * k * n_embd)) * sizeof(float);
  if (ffn_out_.size < y_bytes) {
    MOELITE_TRY(dev_->flush());
    dev_->free(&ffn_out_);
    MOELITE_TRY(dev_->alloc(y_bytes, &ffn_out_));
  }
  const Buffer& y = ffn_out_;
  const ActRef* xr = ref(x);
  const bool keep = experts->all_resident();
  auto run_expert = [&](int32_t e, const ExpertWeights& w) -> Status {
    std::vector<int32_t> maps, out_rows;  // the token rows read, the (token, slot) rows written
    groups.rows(e, &maps, &out_rows);
    const uint32_t m = static_cast<uint32_t>(maps.size());
    // Row maps (inputs, then outputs): gate/up gather the tokens into rows 0..m-1; down reads
    // those rows and scatters to the (token, slot) rows.
    std::vector<int32_t> local(m);
    for (uint32_t i = 0; i < m; ++i) local[i] = static_cast<int32_t>(i);
    std::vector<int32_t> in_maps = maps, out_maps = local;
    in_maps.insert(in_maps.end(), local.begin(), local.end());
    out_maps.insert(out_maps.end(), out_rows.begin(), out_rows.end());
    // Discrete devices with a budget: the device tier. Resident experts are cached; zero-copy
    // slots (unified memory) are read in place.
    const DevWeight* tier[3] = {nullptr, nullptr, nullptr};
    if (!keep && !dev_->facts().unified_memory) {
      MOELITE_TRY(experts->wait_down(layer, e));  // all three chunks go to the device at once
      if (!tier_expert(layer, e, w, experts->pool_slots(), tier)) return error_;
    }
    const DevWeight* g = tier[0] ? tier[0] : device_weight(w.gate, keep);
    const DevWeight* u = tier[1] ? tier[1] : device_weight(w.up, keep);
    MOELITE_TRY(error_);
    const int64_t n_ff = w.gate.rows;
    Buffer gbuf, ubuf, min, mout;
    MOELITE_TRY(dev_->temp(nullptr, static_cast<uint64_t>(m) * static_cast<uint64_t>(n_ff) * sizeof(float), &gbuf));
    MOELITE_TRY(dev_->temp(nullptr, static_cast<uint64_t>(m) * static_cast<uint64_t>(n_ff) * sizeof(float), &ubuf));
    MOELITE_TRY(dev_->temp(in_maps.data(), in_maps.size() * sizeof(int32_t), &min));
    MOELITE_TRY(dev_->temp(out_maps.data(), out_maps.size() * sizeof(int32_t), &mout));
    matmul_dev(*g, xr->buf, xr->off, static_cast<uint64_t>(n_embd), gbuf, 0, static_cast<uint64_t>(n_ff), m, nullptr, &min, m);
    matmul_dev(*u, xr->buf, xr->off, static_cast<uint64_t>(n_embd), ubuf, 0, static_cast<uint64_t>(n_ff), m, nullptr, &min, m);
    const uint64_t cnt = static_cast<uint64_t>(m) * static_cast<uint64_t>(n_ff);
    struct { uint32_t x_off, y_off, n, cols, mode; } pc{0, 0, static_cast<uint32_t>(cnt), static_cast<uint32_t>(n_ff), 2};
    dev_->dispatch("add", 0, {{&gbuf}, {&ubuf}}, &pc, sizeof pc, groups_for(cnt));
    MOELITE_TRY(experts->wait_down(layer, e));
    const DevWeight* d = tier[2] ? tier[2] : device_weight(w.down, keep);
    MOELITE_TRY(error_);
    matmul_dev(*d, gbuf, 0, static_cast<uint64_t>(n_ff), y, 0, static_cast<uint64_t>(n_embd), m, nullptr, &mout, m);
    return MOELITE_OK;
  };
  if (experts->all_resident()) {
    for (std::vector<int32_t> pending = order; !pending.empty();) {
      int32_t e;
      ExpertWeights w;
      MOELITE_TRY(experts->acquire_next(layer, &pending, &e, &w));
      MOELITE_TRY(run_expert(e, w));
    }
  } else {
    // Each group's experts stay pinned until the device has run on them: with zero-copy slots
    // it reads them in place, and a released slot may be refilled by the next load.
    const size_t group = static_cast<size_t>(std::max(1, experts->capacity(layer)));
    for (size_t g0 = 0; g0 < order.size(); g0 += group) {
      std::vector<int32_t> pending(order.begin() + static_cast<std::ptrdiff_t>(g0),
                                   order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), g0 + group)));
      MOELITE_TRY(experts->prepare(layer, pending));
      std::vector<int32_t> done;
      Status st = MOELITE_OK;
      bool source_released = false;  // a failed acquire_next releases what was still pending
      while (!pending.empty() && st == MOELITE_OK) {
        int32_t e;
        ExpertWeights w;
        st = experts->acquire_next(layer, &pending, &e, &w);
        if (st != MOELITE_OK) {
          source_released = true;
          break;
        }
        done.push_back(e);
        st = run_expert(e, w);
        // Start the device on this expert while the next one is still loading or transferring.
        if (st == MOELITE_OK && !pending.empty()) st = dev_->submit();
      }
      if (st == MOELITE_OK) st = dev_->flush();
      for (TierSlot& t : tier_) t.in_use = false;  // the device has run on them
      for (int32_t e : done) experts->release(layer, e);
      if (!source_released)
        for (int32_t e : pending) experts->release(layer, e);
      MOELITE_TRY(st);
    }
  }
  // Combine in slot order: weights then ids (as floats) per token.
  std::vector<float> rw(static_cast<size_t>(2 * n * k));
  for (int32_t t = 0; t < n; ++t)
    for (int32_t j = 0; j < k; ++j) {
      rw[static_cast<size_t>(t * 2 * k + j)] = r.weights[static_cast<size_t>(t * k + j)];
      rw[static_cast<size_t>((t * 2 + 1) * k + j)] = static_cast<float>(r.ids[static_cast<size_t>(t * k + j)]);
    }
  Buffer rb;
  MOELITE_TRY(dev_->temp(rw.data(), rw.size() * sizeof(float), &rb));
  const ActRef* o = ref(*out);
  const uint64_t total = static_cast<uint64_t>(n) * static_cast<uint64_t>(n_embd);
  struct { uint32_t o_off, cols, k, n; } pc{static_cast<uint32_t>(o->off), static_cast<uint32_t>(n_embd), static_cast<uint32_t>(k),
                                            static_cast<uint32_t>(n)};
  dev_->dispatch("combine", 0, {{&y}, {&rb}, {&o->buf}}, &pc, sizeof pc, groups_for(total));
  return error_;
}

void VulkanBackend::dense_ffn(const ExpertWeights& w, const float* gate_inp, const Act& x, Act* out) {
  const DevWeight *g = device_weight(w.gate, true), *u = device_weight(w.up, true), *d = device_weight(w.down, true);
  if (!g || !u || !d) return;
  const int64_t n_ff = w.gate.rows;
  const uint64_t cnt = static_cast<uint64_t>(x.rows) * static_cast<uint64_t>(n_ff);
  Buffer gbuf, ubuf;
  Status st = dev_->temp(nullptr, cnt * sizeof(float), &gbuf);
  if (st == MOELITE_OK) st = dev_->temp(nullptr, cnt * sizeof(float), &ubuf);
  remember(st);
  if (st != MOELITE_OK) return;
  const ActRef *xr = ref(x), *o = ref(*out);
  matmul_dev(*g, xr->buf, xr->off, static_cast<uint64_t>(x.cols), gbuf, 0, static_cast<uint64_t>(n_ff), x.rows, nullptr, nullptr, 0);
  matmul_dev(*u, xr->buf, xr->off, static_cast<uint64_t>(x.cols), ubuf, 0, static_cast<uint64_t>(n_ff), x.rows, nullptr, nullptr, 0);
  struct { uint32_t x_off, y_off, n, cols, mode; } pc{0, 0, static_cast<uint32_t>(cnt), static_cast<uint32_t>(n_ff), 2};
  dev_->dispatch("add", 0, {{&gbuf}, {&ubuf}}, &pc, sizeof pc, groups_for(cnt));
  matmul_dev(*d, gbuf, 0, static_cast<uint64_t>(n_ff), o->buf, o->off, static_cast<uint64_t>(out->cols), x.rows, nullptr, nullptr, 0);
  if (!gate_inp) return;
  // The shared expert's gate: sigmoid(gate_inp . x) per token, gate_inp as a one-row F32 weight.
  WeightView gw;
  gw.type = TensorType::F32;
  gw.cols = x.cols;
  gw.rows = 1;
  gw.row_bytes = static_cast<uint64_t>(x.cols) * sizeof(float);
  gw.data = reinterpret_cast<const uint8_t*>(gate_inp);
  const DevWeight* gd = device_weight(gw, true);
  Buffer gate;
  remember(dev_->temp(nullptr, static_cast<uint64_t>(x.rows) * sizeof(float), &gate));
  if (!gd || !gate.buffer) return;
  matmul_dev(*gd, xr->buf, xr->off, static_cast<uint64_t>(x.cols), gate, 0, 1, x.rows, nullptr, nullptr, 0);
  const uint64_t total = static_cast<uint64_t>(out->rows * out->cols);
  struct { uint32_t x_off, y_off, n, cols, mode; } sc{static_cast<uint32_t>(o->off), 0, static_cast<uint32_t>(total),
                                                      static_cast<uint32_t>(out->cols), 1};
  dev_->dispatch("add", 0, {{&o->buf}, {&gate}}, &sc, sizeof sc, groups_for(total));
}

}  // namespace moelite::vk
