#include "backends/vulkan/vk_backend.h"

#include "backends/column_copy.h"
#include "backends/kv_layout.h"
#include "base/rope_angles.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>

namespace moelite::vk {

namespace {

constexpr uint32_t kGroup = 64;          // local size of the element-wise shaders
constexpr uint32_t kMaxGroupsX = 65535;  // the guaranteed maxComputeWorkGroupCount[0]
// Tokens one matmul workgroup multiplies with each decoded weight: NT in shaders/matmul.glsl.
constexpr int64_t kMatmulTokensPerGroup = 4;

uint32_t groups_for(uint64_t n) { return static_cast<uint32_t>((n + kGroup - 1) / kGroup); }

// Push constants of add.comp: x += y (mode 0), x *= sigmoid(y[row]) (1), x = act(x, y) (2: SwiGLU,
// 3: SwiGLUClamped with alpha and limit).
struct AddPush {
  uint32_t x_off, y_off, n, cols, mode;
  float alpha, limit;
};

uint32_t activation_mode(const FfnKind& kind) { return kind.activation == FfnActivation::SwiGLU ? 2u : 3u; }

bool computable(TensorType t) {
  switch (t) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16:
    case TensorType::Q4_0:
    case TensorType::Q4_1:
    case TensorType::Q5_0:
    case TensorType::Q5_1:
    case TensorType::Q8_0:
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
    case TensorType::MXFP4: return true;
    default: return false;
  }
}

}  // namespace

Status VulkanBackend::create(bool allow_cpu, std::unique_ptr<Backend>* out) {
  std::unique_ptr<Device> dev;
  MOELITE_TRY(Device::create(allow_cpu, &dev));
  std::unique_ptr<VulkanBackend> b(new VulkanBackend(std::move(dev), std::make_shared<Shared>()));
  MOELITE_TRY(b->dev_->alloc(16, &b->dummy_));
  *out = std::move(b);
  return MOELITE_OK;
}

Status VulkanBackend::create_peer(std::unique_ptr<Backend>* out) {
  std::unique_ptr<Device> stream;
  MOELITE_TRY(dev_->create_stream(&stream));
  std::unique_ptr<VulkanBackend> b(new VulkanBackend(std::move(stream), shared_));
  b->is_peer_ = true;
  b->tier_slots_ = tier_slots_;
  MOELITE_TRY(b->dev_->alloc(16, &b->dummy_));
  *out = std::move(b);
  return MOELITE_OK;
}

VulkanBackend::VulkanBackend(std::unique_ptr<Device> dev, std::shared_ptr<Shared> shared)
    : dev_(std::move(dev)), shared_(std::move(shared)) {
  name_ = "vulkan (" + dev_->facts().name + ")";
}

VulkanBackend::~VulkanBackend() {
  dev_->flush();
  release_tier_slots();
  if (tier_hits_ + tier_loads_ + tier_own_copies_ > 0)
    log_msg(MOELITE_LOG_INFO,
            "vulkan: device expert tier: %" PRIu64 " hits, %" PRIu64 " loads over the transfer queue, %" PRIu64
            " copies of slots other streams held",
            tier_hits_, tier_loads_, tier_own_copies_);
  if (!is_peer_) {
    for (TierSlot& t : shared_->tier)
      for (Buffer& b : t.chunk) dev_->free(&b);
    for (SharedRegion& sh : shared_->regions) dev_->free(&sh.buf);
    for (auto& kv : shared_->weights)
      for (auto& c : kv.second->chunks) dev_->free(&c.buf);
    for (auto& kv : shared_->floats) dev_->free(&kv.second);
  }
  dev_->free(&scores_);
  dev_->free(&ffn_out_);
  dev_->free(&dummy_);
}

// ---- memory

void* VulkanBackend::alloc_shared(uint64_t bytes) {
  // Only where device memory is the host's, and within one storage buffer (beyond it the store
  // keeps ordinary memory and experts are copied in).
  constexpr uint64_t kAlign = 4096;  // direct I/O lands in the slots
  if (!dev_->facts().unified_memory || bytes + kAlign > dev_->facts().max_storage_range) return nullptr;
  SharedRegion sh;
  if (dev_->alloc(bytes + kAlign, &sh.buf) != MOELITE_OK || !sh.buf.mapped) {
    clear_error();
    if (sh.buf.buffer) dev_->free(&sh.buf);
    return nullptr;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(sh.buf.mapped);
  sh.host = reinterpret_cast<uint8_t*>((base + kAlign - 1) / kAlign * kAlign);
  sh.bytes = bytes;
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->regions.push_back(sh);
  return sh.host;
}

void VulkanBackend::free_shared(void* p) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  std::vector<SharedRegion>& regions = shared_->regions;
  for (auto it = regions.begin(); it != regions.end(); ++it)
    if (it->host == p) {
      dev_->flush();
      dev_->free(&it->buf);
      regions.erase(it);
      return;
    }
}

const VulkanBackend::DevWeight* VulkanBackend::buffer_view(const WeightView& w, const Buffer& buf, uint64_t offset) {
  auto dw = std::make_unique<DevWeight>();
  dw->type = w.type;
  dw->row_bytes = w.row_bytes;
  dw->cols = w.cols;
  DevWeight::Chunk c;
  c.buf = buf;
  c.offset = offset;
  c.rows = w.rows;
  dw->chunks.push_back(c);
  temp_weights_.push_back(std::move(dw));
  return temp_weights_.back().get();
}

const VulkanBackend::DevWeight* VulkanBackend::shared_weight(const WeightView& w) {
  for (const SharedRegion& sh : shared_->regions) {
    if (w.data < sh.host || w.data + w.row_bytes * static_cast<uint64_t>(w.rows) > sh.host + sh.bytes) continue;
    return buffer_view(w, sh.buf, static_cast<uint64_t>(w.data - static_cast<const uint8_t*>(sh.buf.mapped)));
  }
  return nullptr;
}

Status VulkanBackend::tier_chunk(const ExpertTask& task, int chunk, const DevWeight** out) {
  const WeightView& view = chunk == 0 ? task.w.gate : (chunk == 1 ? task.w.up : task.w.down);
  std::vector<TierSlot>& tier = shared_->tier;
  size_t made = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->tier_mu);
    if (tier.empty()) tier.resize(made = static_cast<size_t>(std::max<int64_t>(tier_slots_, 2)));
  }
  if (made) log_msg(MOELITE_LOG_INFO, "vulkan: device expert tier of %zu slots", made);  // no lock around a callback
  std::unique_lock<std::mutex> lock(shared_->tier_mu);
  TierPick pick;
  while ((pick = pick_tier_slot(tier, &shared_->tier_clock, task.layer, task.expert, this)).kind ==
         TierPick::ReleaseOwnFirst) {
    // Every slot no other stream holds is read by this stream's recorded work: run it first
    // (keeping the temporaries that the pass's later dispatches read), then pick again.
    lock.unlock();
    MOELITE_TRY(dev_->finish());
    release_tier_slots();
    lock.lock();
  }
  if (pick.kind == TierPick::OwnCopy) {
    // Other streams' recorded work reads the slots this would use (and may still be copying into
    // them): rather than wait for those streams, this submission reads a copy of its own.
    lock.unlock();
    ++tier_own_copies_;
    return device_weight(view, /*keep=*/false, out);
  }
  TierSlot* slot = &tier[pick.index];
  if (pick.reassigned)
    for (bool& h : slot->has) h = false;
  // Held: no other stream reads or writes the slot's chunks until release_tier_slots. (A slot
  // taken from no holder needs no wait here: its last holder ran its work before releasing it.)
  lock.unlock();
  if (slot->has[chunk]) {
    ++tier_hits_;
  } else {
    ++tier_loads_;
    const uint64_t bytes = view.bytes();
    Buffer& buf = slot->chunk[chunk];
    Status st = MOELITE_OK;
    if (buf.size < (bytes + 3) / 4 * 4) {
      dev_->free(&buf);
      st = dev_->alloc_device((bytes + 3) / 4 * 4, &buf);
    }
    if (st == MOELITE_OK) st = dev_->transfer(buf, view.data, bytes);
    if (st != MOELITE_OK) {
      std::lock_guard<std::mutex> relock(shared_->tier_mu);
      slot->layer = -1;  // what the slot holds is unknown now
      return st;
    }
    slot->has[chunk] = true;
  }
  *out = buffer_view(view, slot->chunk[chunk], 0);
  return MOELITE_OK;
}

void VulkanBackend::release_tier_slots() {
  std::lock_guard<std::mutex> lock(shared_->tier_mu);
  for (TierSlot& t : shared_->tier)
    if (t.holder == this) t.holder = nullptr;
}

Status VulkanBackend::check_weight(const WeightView& w) {
  if (!computable(w.type))
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "the Vulkan backend has no kernels for weight type %s",
                type_name(w.type));
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
    Status st = MOELITE_OK;
    if (keep == Keep::Temporary) {
      st = dev_->temp(src, bytes, &c.buf);  // freed with the submission's temporaries
    } else {
      // Complete before it is in the cache: a peer's stream may read it as soon as it is found.
      st = dev_->alloc((bytes + 3) / 4 * 4, &c.buf);  // shaders read whole 32-bit words
      if (st == MOELITE_OK) {
        st = dev_->write_now(c.buf, src, bytes);
        if (st != MOELITE_OK) dev_->free(&c.buf);
      }
      if (st != MOELITE_OK)
        for (DevWeight::Chunk& made : dw->chunks) dev_->free(&made.buf);
    }
    MOELITE_TRY(st);
    dw->chunks.push_back(c);
  }
  *out = dw.get();
  if (keep == Keep::Cached)
    shared_->weights[w.data] = std::move(dw);
  else
    temp_weights_.push_back(std::move(dw));
  return MOELITE_OK;
}

Status VulkanBackend::place_weight(const WeightView& w) {
  if (!w.data) return fail(MOELITE_ERR_INTERNAL, "vulkan: a weight to place has no host bytes");
  // Placing bytes at an address placed before replaces that copy (the old bytes are gone). Only
  // at load, before any peer exists.
  std::lock_guard<std::mutex> lock(shared_->mu);
  auto it = shared_->weights.find(w.data);
  if (it != shared_->weights.end()) {
    MOELITE_TRY(dev_->flush());  // recorded work may still read the old copy
    for (auto& c : it->second->chunks) dev_->free(&c.buf);
    shared_->weights.erase(it);
  }
  DevWeight* dw;
  return upload_weight(w, Keep::Cached, &dw);
}

Status VulkanBackend::device_weight(const WeightView& w, bool keep, const DevWeight** out) {
  DevWeight* dw = nullptr;
  {
    // Held through a cached upload, so two peers never copy the same weight.
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto it = shared_->weights.find(w.data);
    if (it != shared_->weights.end()) {
      *out = it->second.get();
      return MOELITE_OK;
    }
    if ((*out = shared_weight(w)) != nullptr) return MOELITE_OK;
    if (keep) {
      MOELITE_TRY(upload_weight(w, Keep::Cached, &dw));
      *out = dw;
      return MOELITE_OK;
    }
  }
  MOELITE_TRY(upload_weight(w, Keep::Temporary, &dw));
  *out = dw;
  return MOELITE_OK;
}

Status VulkanBackend::host_floats(const float* p, size_t n, const Buffer** out) {
  *out = &dummy_;
  if (!p) return MOELITE_OK;
  std::lock_guard<std::mutex> lock(shared_->mu);
  auto it = shared_->floats.find(p);
  if (it == shared_->floats.end()) {
    Buffer b;
    MOELITE_TRY(dev_->alloc(n * sizeof(float), &b));
    const Status st = dev_->write_now(b, p, n * sizeof(float));  // complete before a peer can find it
    if (st != MOELITE_OK) {
      dev_->free(&b);
      return st;
    }
    it = shared_->floats.emplace(p, b).first;
  }
  *out = &it->second;
  return MOELITE_OK;
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

Status VulkanBackend::read_rows(const Act& a, int64_t row0, int64_t n, float* dst) {
  const ActRef* r = ref(a);
  return dev_->download(r->buf, (r->off + static_cast<uint64_t>(row0 * a.cols)) * sizeof(float), dst,
                        static_cast<uint64_t>(n * a.cols) * sizeof(float));
}

Status VulkanBackend::sync() { return dev_->flush(); }

Status VulkanBackend::alloc_kv(int32_t n_ctx, const std::vector<int32_t>& slots, int64_t kv_dim, bool values,
                               KvCache* out) {
  KvCache made = kv_cache_shape(n_ctx, slots, kv_dim, values);  // may throw; nothing is allocated yet
  auto kv = std::make_unique<KvRef>();
  kv->layers.reserve(slots.size());  // so that no push_back can throw after its allocation
  for (const int32_t n : slots) {  // keys at [0, n * kv_dim), values (if any) after them
    Buffer b;
    const Status st = dev_->alloc((values ? 2ull : 1ull) * static_cast<uint64_t>(n) * static_cast<uint64_t>(kv_dim) * sizeof(float), &b);
    if (st != MOELITE_OK) {
      for (Buffer& x : kv->layers) dev_->free(&x);
      return st;
    }
    kv->layers.push_back(b);
  }
  made.handle = kv.release();
  *out = std::move(made);
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

Status VulkanBackend::get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) {
  const DevWeight* w;
  MOELITE_TRY(device_weight(table, true, &w));
  const ActRef* o = ref(*out);
  struct {
    uint32_t w_off, row_bytes, cols, y_off, y_stride;
  } pc{0, static_cast<uint32_t>(w->row_bytes), static_cast<uint32_t>(w->cols), 0, static_cast<uint32_t>(out->cols)};
  // One dispatch per chunk the tokens' rows lie in (one chunk unless the table was split).
  for (const auto& c : w->chunks) {
    for (int32_t t = 0; t < n; ++t) {
      if (tokens[t] < c.row0 || tokens[t] >= c.row0 + c.rows) continue;
      const bool whole = w->chunks.size() == 1;
      std::vector<int32_t> ids;
      if (whole)
        ids.assign(tokens, tokens + n);
      else
        ids.push_back(tokens[t] - static_cast<int32_t>(c.row0));
      Buffer ib;
      MOELITE_TRY(dev_->temp(ids.data(), ids.size() * sizeof(int32_t), &ib));
      pc.w_off = static_cast<uint32_t>(c.offset);
      pc.y_off =
          static_cast<uint32_t>(o->off + (whole ? 0 : static_cast<uint64_t>(t) * static_cast<uint64_t>(out->cols)));
      dev_->dispatch("get_rows", static_cast<uint32_t>(w->type), {{&c.buf}, {&ib}, {&o->buf}}, &pc, sizeof pc,
                     groups_for(static_cast<uint64_t>(w->cols)), static_cast<uint32_t>(ids.size()));
      if (whole) return MOELITE_OK;
    }
  }
  return MOELITE_OK;
}

Status VulkanBackend::rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) {
  const ActRef *xr = ref(x), *o = ref(*out);
  const Buffer* wbp;
  MOELITE_TRY(host_floats(w, static_cast<size_t>(group), &wbp));
  const Buffer& wb = *wbp;
  struct {
    uint32_t x_off, y_off, cols, group, has_w;
    float eps;
  } pc{static_cast<uint32_t>(xr->off),
       static_cast<uint32_t>(o->off),
       static_cast<uint32_t>(x.cols),
       static_cast<uint32_t>(group),
       w ? 1u : 0u,
       eps};
  dev_->dispatch("rms_norm", 0, {{&xr->buf}, {&o->buf}, {&wb}}, &pc, sizeof pc,
                 static_cast<uint32_t>(x.rows * (x.cols / group)));
  return MOELITE_OK;
}

void VulkanBackend::matmul_dev(const DevWeight& w, const Buffer& x, uint64_t x_off, uint64_t x_stride, const Buffer& y,
                               uint64_t y_off, uint64_t y_stride, int64_t n, const Buffer* bias, const Buffer* maps,
                               uint32_t map_n) {
  for (const auto& c : w.chunks) {
    for (int64_t r0 = 0; r0 < c.rows; r0 += kMaxGroupsX) {
      const uint32_t rows = static_cast<uint32_t>(std::min<int64_t>(kMaxGroupsX, c.rows - r0));
      struct {
        uint32_t w_off, row_bytes, cols, row0, x_off, x_stride, y_off, y_stride, flags, map_n, y_col0, n_tok;
      } pc{static_cast<uint32_t>(c.offset),     static_cast<uint32_t>(w.row_bytes),
           static_cast<uint32_t>(w.cols),       static_cast<uint32_t>(r0),
           static_cast<uint32_t>(x_off),        static_cast<uint32_t>(x_stride),
           static_cast<uint32_t>(y_off),        static_cast<uint32_t>(y_stride),
           (bias ? 1u : 0u) | (maps ? 6u : 0u), map_n,
           static_cast<uint32_t>(c.row0),       static_cast<uint32_t>(n)};
      const bool one = n == 1;  // decode: the one-token shader, the same bits without idle accumulators
      const auto token_groups = static_cast<uint32_t>((n + kMatmulTokensPerGroup - 1) / kMatmulTokensPerGroup);
      const char* shader = dev_->facts().use_subgroups ? (one ? "matmul_subgroup_vec" : "matmul_subgroup")
                                                       : (one ? "matmul_vec" : "matmul");
      dev_->dispatch(shader, static_cast<uint32_t>(w.type),
                     {{&c.buf}, {&x}, {&y}, {bias ? bias : &dummy_}, {maps ? maps : &dummy_}}, &pc, sizeof pc, rows,
                     token_groups);
    }
  }
}

Status VulkanBackend::matmul(const WeightView& w, const Act& x, const float* bias, Act* out) {
  const DevWeight* dw;
  MOELITE_TRY(device_weight(w, true, &dw));
  const ActRef *xr = ref(x), *o = ref(*out);
  const Buffer* b = nullptr;
  if (bias) MOELITE_TRY(host_floats(bias, static_cast<size_t>(w.rows), &b));
  matmul_dev(*dw, xr->buf, xr->off, static_cast<uint64_t>(x.cols), o->buf, o->off, static_cast<uint64_t>(out->cols),
             x.rows, b, nullptr, 0);
  return MOELITE_OK;
}

Status VulkanBackend::add(Act* x, const Act& y) {
  const ActRef *xr = ref(*x), *yr = ref(y);
  const uint64_t n = static_cast<uint64_t>(x->rows * x->cols);
  const AddPush pc{static_cast<uint32_t>(xr->off),
                   static_cast<uint32_t>(yr->off),
                   static_cast<uint32_t>(n),
                   static_cast<uint32_t>(x->cols),
                   0,
                   0.0f,
                   0.0f};
  dev_->dispatch("add", 0, {{&xr->buf}, {&yr->buf}}, &pc, sizeof pc, groups_for(n));
  return MOELITE_OK;
}

Status VulkanBackend::scale(Act* x, float s) {
  const ActRef* xr = ref(*x);
  const uint64_t n = static_cast<uint64_t>(x->rows * x->cols);
  const AddPush pc{static_cast<uint32_t>(xr->off), 0, static_cast<uint32_t>(n), static_cast<uint32_t>(x->cols), 4, s,
                   0.0f};
  dev_->dispatch("add", 0, {{&xr->buf}, {&dummy_}}, &pc, sizeof pc, groups_for(n));
  return MOELITE_OK;
}

Status VulkanBackend::add_bias(Act* x, const float* bias) {
  const ActRef* xr = ref(*x);
  const Buffer* b;
  MOELITE_TRY(host_floats(bias, static_cast<size_t>(x->cols), &b));
  const uint64_t n = static_cast<uint64_t>(x->rows * x->cols);
  const AddPush pc{static_cast<uint32_t>(xr->off), 0, static_cast<uint32_t>(n), static_cast<uint32_t>(x->cols), 5, 0.0f,
                   0.0f};
  dev_->dispatch("add", 0, {{&xr->buf}, {b}}, &pc, sizeof pc, groups_for(n));
  return MOELITE_OK;
}

Status VulkanBackend::rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) {
  // Angles in double on the host, as the CPU backend computes them.
  const int32_t half = p.n_rot / 2;
  const std::vector<float> cs = rope_cos_sin_table(static_cast<double>(p.freq_base), p.n_rot, p.scaling, positions, x->rows);
  Buffer angles;
  MOELITE_TRY(dev_->temp(cs.data(), cs.size() * sizeof(float), &angles));
  const ActRef* xr = ref(*x);
  const uint64_t pairs =
      static_cast<uint64_t>(x->rows) * static_cast<uint64_t>(x->cols / head_dim) * static_cast<uint64_t>(half);
  struct {
    uint32_t x_off, cols, head_dim, n_rot, neox, n_pairs_total;
  } pc{static_cast<uint32_t>(xr->off), static_cast<uint32_t>(x->cols),       static_cast<uint32_t>(head_dim),
       static_cast<uint32_t>(p.n_rot), p.style == RopeStyle::Neox ? 1u : 0u, static_cast<uint32_t>(pairs)};
  dev_->dispatch("rope", 0, {{&xr->buf}, {&angles}}, &pc, sizeof pc, groups_for(pairs));
  return MOELITE_OK;
}

Status VulkanBackend::copy_columns(const Act& x, int64_t x_stride, int64_t x_offset, int32_t n_groups, int64_t width,
                                   Act* out, int64_t out_stride, int64_t out_offset) {
  MOELITE_TRY(check_copy_columns(x, x_stride, x_offset, n_groups, width, *out, out_stride, out_offset));
  const ActRef *xr = ref(x), *o = ref(*out);
  const uint64_t n = static_cast<uint64_t>(x.rows) * static_cast<uint64_t>(n_groups) * static_cast<uint64_t>(width);
  struct {
    uint32_t x_base, x_cols, x_stride, x_offset, o_base, o_cols, o_stride, o_offset, n_groups, width, n;
  } pc{static_cast<uint32_t>(xr->off),   static_cast<uint32_t>(x.cols),       static_cast<uint32_t>(x_stride),
       static_cast<uint32_t>(x_offset),  static_cast<uint32_t>(o->off),       static_cast<uint32_t>(out->cols),
       static_cast<uint32_t>(out_stride), static_cast<uint32_t>(out_offset), static_cast<uint32_t>(n_groups),
       static_cast<uint32_t>(width),     static_cast<uint32_t>(n)};
  dev_->dispatch("copy_columns", 0, {{&xr->buf}, {&o->buf}}, &pc, sizeof pc, groups_for(n));
  return MOELITE_OK;
}

Status VulkanBackend::attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0,
                                int32_t n_head, int32_t n_head_kv, int64_t head_dim, const AttentionSpec& spec,
                                Act* out) {
  const uint64_t n = static_cast<uint64_t>(q.rows);
  MOELITE_TRY(kv_check_batch(*kv, layer, pos0, q.rows, spec));
  int64_t head_dim_v = 0;
  MOELITE_TRY(kv_value_width(*kv, spec, head_dim, &head_dim_v));
  const Buffer& cache = static_cast<KvRef*>(kv->handle)->layers[static_cast<size_t>(layer)];
  const uint64_t kv_dim = static_cast<uint64_t>(kv->kv_dim);
  const uint64_t slots = static_cast<uint64_t>(kv->slots[static_cast<size_t>(layer)]);
  const ActRef *qr = ref(q), *kr = ref(k), *vr = ref(kv->values ? v : k), *o = ref(*out);
  const Buffer* sinks;
  MOELITE_TRY(host_floats(spec.sinks, static_cast<size_t>(n_head), &sinks));
  struct {
    uint32_t k_off, v_off, kv_dim, n, pos0, slots, has_v;
  } st{static_cast<uint32_t>(kr->off), static_cast<uint32_t>(vr->off), static_cast<uint32_t>(kv_dim),
       static_cast<uint32_t>(n),       static_cast<uint32_t>(pos0),     static_cast<uint32_t>(slots),
       kv->values ? 1u : 0u};
  dev_->dispatch("kv_store", 0, {{&kr->buf}, {&vr->buf}, {&cache}}, &st, sizeof st, groups_for(n * kv_dim));
  // Scores scratch: a chunk of tokens at a time, so any context length fits the storage range.
  const uint64_t per_token = static_cast<uint64_t>(n_head) * slots * sizeof(float);
  const uint64_t chunk = std::max<uint64_t>(1, std::min<uint64_t>(n, (uint64_t{64} << 20) / per_token));
  if (scores_.size < chunk * per_token) {
    MOELITE_TRY(dev_->flush());
    dev_->free(&scores_);
    MOELITE_TRY(dev_->alloc(chunk * per_token, &scores_));
  }
  for (uint64_t t0 = 0; t0 < n; t0 += chunk) {
    const uint64_t m = std::min(chunk, n - t0);
    struct {
      uint32_t q_off, o_off, cache_v, kv_dim, head_dim, head_dim_v, n_head, n_head_kv, pos0, slots, window, has_sinks;
      float scale;
    } pc{static_cast<uint32_t>(qr->off + t0 * static_cast<uint64_t>(q.cols)),
         static_cast<uint32_t>(o->off + t0 * static_cast<uint64_t>(out->cols)),
         static_cast<uint32_t>(kv->values ? slots * kv_dim : 0),
         static_cast<uint32_t>(kv_dim),
         static_cast<uint32_t>(head_dim),
         static_cast<uint32_t>(head_dim_v),
         static_cast<uint32_t>(n_head),
         static_cast<uint32_t>(n_head_kv),
         static_cast<uint32_t>(pos0 + static_cast<int64_t>(t0)),
         static_cast<uint32_t>(slots),
         static_cast<uint32_t>(std::max(0, spec.window)),
         spec.sinks ? 1u : 0u,
         spec.scale > 0.0f ? spec.scale : 1.0f / std::sqrt(static_cast<float>(head_dim))};
    dev_->dispatch("attention", 0, {{&qr->buf}, {&cache}, {&o->buf}, {&scores_}, {sinks}}, &pc, sizeof pc,
                   static_cast<uint32_t>(m * static_cast<uint64_t>(n_head)));
  }
  return MOELITE_OK;
}

// A layer's buffer holds its slots' keys, then (if stored) as many values.
Status VulkanBackend::read_kv(const KvCache& kv, int32_t layer, int32_t slot0, int32_t n, float* keys,
                              float* values) {
  MOELITE_TRY(kv_check_slots(kv, layer, slot0, n));
  const Buffer& b = static_cast<KvRef*>(kv.handle)->layers[static_cast<size_t>(layer)];
  const uint64_t row = static_cast<uint64_t>(kv.kv_dim) * sizeof(float), count = static_cast<uint64_t>(n) * row;
  const uint64_t off = static_cast<uint64_t>(slot0) * row, values_at = static_cast<uint64_t>(kv.slots[static_cast<size_t>(layer)]) * row;
  MOELITE_TRY(dev_->download(b, off, keys, count));
  return kv.values ? dev_->download(b, values_at + off, values, count) : MOELITE_OK;
}

Status VulkanBackend::write_kv(KvCache* kv, int32_t layer, int32_t slot0, int32_t n, const float* keys,
                               const float* values) {
  MOELITE_TRY(kv_check_slots(*kv, layer, slot0, n));
  const Buffer& b = static_cast<KvRef*>(kv->handle)->layers[static_cast<size_t>(layer)];
  const uint64_t row = static_cast<uint64_t>(kv->kv_dim) * sizeof(float), count = static_cast<uint64_t>(n) * row;
  const uint64_t off = static_cast<uint64_t>(slot0) * row, values_at = static_cast<uint64_t>(kv->slots[static_cast<size_t>(layer)]) * row;
  MOELITE_TRY(dev_->upload(b, off, keys, count));
  if (kv->values) MOELITE_TRY(dev_->upload(b, values_at + off, values, count));
  return dev_->flush();
}

Status VulkanBackend::route(const Act& logits, int32_t k, bool renormalize, Routing* r) {
  const uint64_t n = static_cast<uint64_t>(logits.rows), nk = n * static_cast<uint64_t>(k);
  r->n_tokens = static_cast<int32_t>(n);
  r->k = k;
  r->ids.assign(nk, 0);
  r->weights.assign(nk, 0.0f);
  // One buffer read back at once (a read-back releases the submission's temporaries): all ids,
  // then all weights.
  Buffer out;
  MOELITE_TRY(dev_->temp(nullptr, 2 * nk * sizeof(float), &out));
  const ActRef* lr = ref(logits);
  struct {
    uint32_t l_off, n_expert, k, n, renorm;
  } pc{static_cast<uint32_t>(lr->off), static_cast<uint32_t>(logits.cols), static_cast<uint32_t>(k),
       static_cast<uint32_t>(n), renormalize ? 1u : 0u};
  dev_->dispatch("route", 0, {{&lr->buf}, {&out}}, &pc, sizeof pc, groups_for(n));
  // Only the chosen experts come back.
  std::vector<uint32_t> host(2 * nk);
  MOELITE_TRY(dev_->download(out, 0, host.data(), host.size() * sizeof(uint32_t)));
  memcpy(r->ids.data(), host.data(), nk * sizeof(int32_t));
  memcpy(r->weights.data(), host.data() + nk, nk * sizeof(float));
  return MOELITE_OK;
}

// ---- routed experts

Status VulkanBackend::moe_begin(const Act& x, const FfnKind& kind, int64_t n_out_rows) {
  temp_weights_.clear();
  pending_.clear();
  pass_reads_host_ = false;
  pass_x_ = x;
  pass_kind_ = kind;
  // Per (token, slot) expert outputs, combined in slot order at the end (kept across the
  // submissions of a budgeted layer, so not a temporary).
  const uint64_t y_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(n_out_rows * x.cols)) * sizeof(float);
  if (ffn_out_.size < y_bytes) {
    MOELITE_TRY(dev_->flush());
    dev_->free(&ffn_out_);
    MOELITE_TRY(dev_->alloc(y_bytes, &ffn_out_));
  }
  return MOELITE_OK;
}

// Where a task's matrix is read from: the device tier (discrete devices, budgeted experts), the
// zero-copy slot pool (unified memory), a copy kept across calls (resident experts) or a copy for
// this submission.
Status VulkanBackend::expert_matrix(const ExpertTask& task, int chunk, const DevWeight** out) {
  if (!task.resident) pass_reads_host_ = true;
  if (!task.resident && !dev_->facts().unified_memory) return tier_chunk(task, chunk, out);
  const WeightView& w = chunk == 0 ? task.w.gate : (chunk == 1 ? task.w.up : task.w.down);
  return device_weight(w, task.resident, out);
}

Status VulkanBackend::expert_gate_up(const ExpertTask* tasks, int32_t n_tasks) {
  const ActRef* xr = ref(pass_x_);
  const uint64_t n_embd = static_cast<uint64_t>(pass_x_.cols);
  pending_.clear();
  for (int32_t i = 0; i < n_tasks; ++i) {
    const ExpertTask& task = tasks[i];
    const uint32_t m = static_cast<uint32_t>(task.n_rows);
    const int64_t n_ff = task.w.gate.rows;
    // Row maps (inputs, then outputs): gate/up gather the tokens into rows 0..m-1; down reads
    // those rows and scatters to the (token, slot) rows.
    std::vector<int32_t> in_maps(task.x_rows, task.x_rows + m), out_maps(m);
    for (uint32_t r = 0; r < m; ++r) out_maps[r] = static_cast<int32_t>(r);
    in_maps.insert(in_maps.end(), out_maps.begin(), out_maps.end());
    out_maps.insert(out_maps.end(), task.out_rows, task.out_rows + m);
    const DevWeight *g, *u;
    MOELITE_TRY(expert_matrix(task, 0, &g));
    MOELITE_TRY(expert_matrix(task, 1, &u));
    const Buffer *gb = nullptr, *ub = nullptr;
    if (task.w.gate_bias) MOELITE_TRY(host_floats(task.w.gate_bias, static_cast<size_t>(n_ff), &gb));
    if (task.w.up_bias) MOELITE_TRY(host_floats(task.w.up_bias, static_cast<size_t>(n_ff), &ub));
    PendingExpert pe;
    const uint64_t h_bytes = static_cast<uint64_t>(m) * static_cast<uint64_t>(n_ff) * sizeof(float);
    MOELITE_TRY(dev_->temp(nullptr, h_bytes, &pe.h));
    MOELITE_TRY(dev_->temp(nullptr, h_bytes, &pe.up));
    MOELITE_TRY(dev_->temp(in_maps.data(), in_maps.size() * sizeof(int32_t), &pe.in_map));
    MOELITE_TRY(dev_->temp(out_maps.data(), out_maps.size() * sizeof(int32_t), &pe.out_map));
    matmul_dev(*g, xr->buf, xr->off, n_embd, pe.h, 0, static_cast<uint64_t>(n_ff), m, gb, &pe.in_map, m);
    matmul_dev(*u, xr->buf, xr->off, n_embd, pe.up, 0, static_cast<uint64_t>(n_ff), m, ub, &pe.in_map, m);
    const uint64_t cnt = static_cast<uint64_t>(m) * static_cast<uint64_t>(n_ff);
    const AddPush pc{0,
                     0,
                     static_cast<uint32_t>(cnt),
                     static_cast<uint32_t>(n_ff),
                     activation_mode(pass_kind_),
                     pass_kind_.alpha,
                     pass_kind_.limit};
    dev_->dispatch("add", 0, {{&pe.h}, {&pe.up}}, &pc, sizeof pc, groups_for(cnt));
    pending_.push_back(pe);
  }
  return MOELITE_OK;
}

Status VulkanBackend::expert_down(const ExpertTask* tasks, int32_t n_tasks) {
  if (pending_.size() != static_cast<size_t>(n_tasks))
    return fail(MOELITE_ERR_INTERNAL, "vulkan: expert_down of %d tasks after a gate/up of %zu", n_tasks,
                pending_.size());
  const uint64_t n_embd = static_cast<uint64_t>(pass_x_.cols);
  for (int32_t i = 0; i < n_tasks; ++i) {
    const ExpertTask& task = tasks[i];
    const PendingExpert& pe = pending_[static_cast<size_t>(i)];
    const uint32_t m = static_cast<uint32_t>(task.n_rows);
    const DevWeight* d;
    MOELITE_TRY(expert_matrix(task, 2, &d));
    const Buffer* db = nullptr;
    if (task.w.down_bias) MOELITE_TRY(host_floats(task.w.down_bias, static_cast<size_t>(n_embd), &db));
    matmul_dev(*d, pe.h, 0, static_cast<uint64_t>(task.w.gate.rows), ffn_out_, 0, n_embd, m, db, &pe.out_map, m);
  }
  pending_.clear();
  // A budgeted expert's work starts at once, so the device computes it while the next expert is
  // still being read from storage or copied to the device tier.
  if (n_tasks > 0 && !tasks[0].resident) MOELITE_TRY(dev_->submit());
  return MOELITE_OK;
}

Status VulkanBackend::expert_round_end() {
  // Resident experts are device copies: nothing to wait for until a result is read back.
  if (!pass_reads_host_) return MOELITE_OK;
  pass_reads_host_ = false;
  const Status st = dev_->flush();
  release_tier_slots();  // the device has run on them
  return st;
}

Status VulkanBackend::moe_combine(const Routing& r, Act* out) {
  const int32_t n = r.n_tokens, k = r.k;
  const int64_t n_embd = out->cols;
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
  struct {
    uint32_t o_off, cols, k, n;
  } pc{static_cast<uint32_t>(o->off), static_cast<uint32_t>(n_embd), static_cast<uint32_t>(k),
       static_cast<uint32_t>(n)};
  dev_->dispatch("combine", 0, {{&ffn_out_}, {&rb}, {&o->buf}}, &pc, sizeof pc, groups_for(total));
  return MOELITE_OK;
}

Status VulkanBackend::dense_ffn(const ExpertWeights& w, const FfnKind& kind, const float* gate_inp, const Act& x,
                                Act* out) {
  const DevWeight *g, *u, *d;
  MOELITE_TRY(device_weight(w.gate, true, &g));
  MOELITE_TRY(device_weight(w.up, true, &u));
  MOELITE_TRY(device_weight(w.down, true, &d));
  const int64_t n_ff = w.gate.rows;
  const Buffer *gbias = nullptr, *ubias = nullptr, *dbias = nullptr;
  if (w.gate_bias) MOELITE_TRY(host_floats(w.gate_bias, static_cast<size_t>(n_ff), &gbias));
  if (w.up_bias) MOELITE_TRY(host_floats(w.up_bias, static_cast<size_t>(n_ff), &ubias));
  if (w.down_bias) MOELITE_TRY(host_floats(w.down_bias, static_cast<size_t>(out->cols), &dbias));
  const uint64_t cnt = static_cast<uint64_t>(x.rows) * static_cast<uint64_t>(n_ff);
  Buffer gbuf, ubuf;
  MOELITE_TRY(dev_->temp(nullptr, cnt * sizeof(float), &gbuf));
  MOELITE_TRY(dev_->temp(nullptr, cnt * sizeof(float), &ubuf));
  const ActRef *xr = ref(x), *o = ref(*out);
  matmul_dev(*g, xr->buf, xr->off, static_cast<uint64_t>(x.cols), gbuf, 0, static_cast<uint64_t>(n_ff), x.rows, gbias,
             nullptr, 0);
  matmul_dev(*u, xr->buf, xr->off, static_cast<uint64_t>(x.cols), ubuf, 0, static_cast<uint64_t>(n_ff), x.rows, ubias,
             nullptr, 0);
  const AddPush pc{
      0, 0, static_cast<uint32_t>(cnt), static_cast<uint32_t>(n_ff), activation_mode(kind), kind.alpha, kind.limit};
  dev_->dispatch("add", 0, {{&gbuf}, {&ubuf}}, &pc, sizeof pc, groups_for(cnt));
  matmul_dev(*d, gbuf, 0, static_cast<uint64_t>(n_ff), o->buf, o->off, static_cast<uint64_t>(out->cols), x.rows, dbias,
             nullptr, 0);
  if (!gate_inp) return MOELITE_OK;
  // The shared expert's gate: sigmoid(gate_inp . x) per token, gate_inp as a one-row F32 weight.
  WeightView gw;
  gw.type = TensorType::F32;
  gw.cols = x.cols;
  gw.rows = 1;
  gw.row_bytes = static_cast<uint64_t>(x.cols) * sizeof(float);
  gw.data = reinterpret_cast<const uint8_t*>(gate_inp);
  const DevWeight* gd;
  MOELITE_TRY(device_weight(gw, true, &gd));
  Buffer gate;
  MOELITE_TRY(dev_->temp(nullptr, static_cast<uint64_t>(x.rows) * sizeof(float), &gate));
  matmul_dev(*gd, xr->buf, xr->off, static_cast<uint64_t>(x.cols), gate, 0, 1, x.rows, nullptr, nullptr, 0);
  const uint64_t total = static_cast<uint64_t>(out->rows * out->cols);
  const AddPush sc{
      static_cast<uint32_t>(o->off), 0, static_cast<uint32_t>(total), static_cast<uint32_t>(out->cols), 1, 0.0f, 0.0f};
  dev_->dispatch("add", 0, {{&o->buf}, {&gate}}, &sc, sizeof sc, groups_for(total));
  return MOELITE_OK;
}

}  // namespace moelite::vk
