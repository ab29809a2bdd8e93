#include "backends/cuda/cuda_backend.h"
#include "base/options.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/column_copy.h"
#include "backends/kv_layout.h"
#include "base/rope_angles.h"

namespace moelite::cuda {
namespace {

constexpr size_t kArenaChunk = size_t(4) << 20;
constexpr size_t kArenaAlign = 256;

// Weight copies are allocated to a multiple of 16 bytes: the matrix products read rows in aligned
// 16-byte loads, and the last one of a tensor whose size is not a multiple of 16 (Q8_0, Q4_0 and
// MXFP4 rows) reaches past its end, into bytes no result uses. On a GPU they are in the same page
// either way; padded, a memory checker (compute-sanitizer) sees only allocated bytes read too.
size_t padded_to_vec16(size_t bytes) { return (bytes + 15) / 16 * 16; }

float* floats(const Act& a) { return static_cast<float*>(a.handle); }

WeightArg arg_of(const WeightView& w, const void* dev) {
  WeightArg a;
  a.type = w.type;
  a.data = static_cast<const uint8_t*>(dev);
  a.row_bytes = w.row_bytes;
  a.rows = w.rows;
  a.cols = w.cols;
  return a;
}

}  // namespace

Status CudaBackend::create(std::unique_ptr<Backend>* out) {
  MOELITE_TRY(check_option(Option::CudaEmulator));  // a load refuses it first; a direct create too
  const char* emu = option_text(Option::CudaEmulator);
  if (emu && std::strcmp(emu, "0") != 0) {
    const bool discrete = std::strcmp(emu, "discrete") == 0;
    std::unique_ptr<GpuRuntime> rt;
    MOELITE_TRY(open_emulated_runtime(!discrete, &rt));
    return create_with(std::move(rt), out);
  }
  std::unique_ptr<GpuRuntime> rt;
  MOELITE_TRY(open_cuda_runtime(&rt));
  return create_with(std::move(rt), out);
}

Status CudaBackend::create_with(std::unique_ptr<GpuRuntime> rt, std::unique_ptr<Backend>* out) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(std::move(rt), std::make_shared<Shared>()));
  MOELITE_TRY(b->init());
  *out = std::move(b);
  return MOELITE_OK;
}

Status CudaBackend::create_peer(std::unique_ptr<Backend>* out) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(rt_, shared_));
  b->is_peer_ = true;
  b->tier_slots_ = tier_slots_;
  b->int8_ = int8_;
  MOELITE_TRY(b->init());
  *out = std::move(b);
  return MOELITE_OK;
}

CudaBackend::CudaBackend(std::shared_ptr<GpuRuntime> rt, std::shared_ptr<Shared> shared)
    : rt_(std::move(rt)), k_(&rt_->kernels()), shared_(std::move(shared)) {
  uploads_.pinned = true;
}

Status CudaBackend::init() {
  const DeviceInfo& d = rt_->info();
  if (!is_peer_) {
    MOELITE_TRY(check_option(Option::CudaProducts));
    const char* products = option_text(Option::CudaProducts);
    int8_ = !products || std::strcmp(products, "float") != 0;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "cuda (%s, sm_%d%d%s)", d.name.c_str(), d.cc_major, d.cc_minor,
                d.integrated ? ", zero-copy experts" : "");
  name_ = buf;
  if (!is_peer_)
    log_msg(MOELITE_LOG_INFO, "cuda: %s, compute capability %d.%d, %llu MiB%s%s", d.name.c_str(), d.cc_major,
            d.cc_minor, (unsigned long long)(d.total_memory >> 20),
            d.integrated ? ", unified memory: budgeted experts are read in place (zero copy)"
                         : ", discrete: budgeted experts go through a device tier",
            d.emulated ? " [SIMT emulator]" : "");
  MOELITE_TRY(rt_->stream_create(&compute_));
  MOELITE_TRY(rt_->stream_create(&copy_));
  MOELITE_TRY(rt_->event_create(&compute_point_));
  return MOELITE_OK;
}

CudaBackend::~CudaBackend() {
  if (tier_hits_ + tier_loads_ + tier_own_copies_ > 0) {
    size_t slots;
    {
      std::lock_guard<std::mutex> lock(shared_->tier_mu);
      slots = shared_->tier.size();
    }
    log_msg(MOELITE_LOG_INFO,
            "cuda: device expert tier of %zu slots: %llu hits, %llu loads over the copy stream, %llu copies of slots "
            "peers held",
            slots, (unsigned long long)tier_hits_, (unsigned long long)tier_loads_,
            (unsigned long long)tier_own_copies_);
  }
  if (compute_) (void)rt_->stream_sync(compute_);
  if (copy_) (void)rt_->stream_sync(copy_);
  {
    std::lock_guard<std::mutex> lock(shared_->tier_mu);
    for (TierSlot& s : shared_->tier)
      if (s.holder == this) s.holder = nullptr;  // its streams have run
  }
  if (!is_peer_)
    for (auto& [host, w] : shared_->weights) rt_->device_free(w.dev);
  arena_free(&uploads_);
  arena_free(&scratch_);
  arena_free(&tables_);
  rt_->device_free(attn_partial_);
  rt_->device_free(pass_out_);
  if (!is_peer_) {
    for (TierSlot& s : shared_->tier) {
      for (int c = 0; c < 3; ++c) {
        rt_->device_free(s.chunk[c]);
        if (s.copied[c]) rt_->event_destroy(s.copied[c]);
      }
      if (s.released) rt_->event_destroy(s.released);
    }
    for (SharedBlock& b : shared_->blocks) rt_->host_free_mapped(b.host);
  }
  if (compute_point_) rt_->event_destroy(compute_point_);
  if (own_copied_) rt_->event_destroy(own_copied_);
  if (copy_) rt_->stream_destroy(copy_);
  if (compute_) rt_->stream_destroy(compute_);
}

// ---- memory

Status CudaBackend::arena_take(Arena* a, size_t bytes, void** host, void** dev) {
  bytes = (std::max<size_t>(bytes, 1) + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  for (Arena::Chunk& c : a->chunks)
    if (c.size - c.used >= bytes) {
      *host = c.host ? c.host + c.used : nullptr;
      *dev = c.dev + c.used;
      c.used += bytes;
      return MOELITE_OK;
    }
  Arena::Chunk c;
  c.size = std::max(bytes, kArenaChunk);
  void *h = nullptr, *d = nullptr;
  if (a->pinned) {
    MOELITE_TRY(rt_->host_alloc_mapped(c.size, &h, &d));
  } else {
    MOELITE_TRY(rt_->device_alloc(c.size, &d));
  }
  c.host = static_cast<uint8_t*>(h);
  c.dev = static_cast<uint8_t*>(d);
  c.used = bytes;
  a->chunks.push_back(c);
  *host = c.host;
  *dev = c.dev;
  return MOELITE_OK;
}

void CudaBackend::arena_free(Arena* a) {
  for (Arena::Chunk& c : a->chunks) {
    if (a->pinned)
      rt_->host_free_mapped(c.host);
    else
      rt_->device_free(c.dev);
  }
  a->chunks.clear();
}

Status CudaBackend::upload(const void* src, size_t bytes, const void** dev) {
  void *h, *d;
  MOELITE_TRY(arena_take(&uploads_, bytes, &h, &d));
  std::memcpy(h, src, bytes);
  *dev = d;
  return MOELITE_OK;
}

Status CudaBackend::take_table(size_t bytes, void** host, void** dev) {
  void* mapped;
  MOELITE_TRY(arena_take(&uploads_, bytes, host, &mapped));
  if (rt_->info().integrated) {
    *dev = mapped;
    return MOELITE_OK;
  }
  void* unused;
  return arena_take(&tables_, bytes, &unused, dev);
}

Status CudaBackend::commit_table(void* host, void* dev, size_t bytes) {
  if (rt_->info().integrated) return MOELITE_OK;
  // The pinned source stays untouched until the next full sync, so the copy may run any time
  // before the kernels behind it.
  return rt_->copy_async(dev, host, bytes, compute_);
}

namespace {
// A grouped product of w's rows; the caller sets the inputs, outputs and biases.
GroupedProduct product_of(const WeightArg& w) {
  GroupedProduct p;
  p.w = w.data;
  p.row_bytes = w.row_bytes;
  p.rows = w.rows;
  p.cols = w.cols;
  return p;
}
}  // namespace

Status CudaBackend::launch_grouped(const std::vector<GroupedProduct>& products, const std::vector<TensorType>& types,
                                   bool gate_up) {
  std::vector<bool> done(products.size(), false);
  for (size_t first = 0; first < products.size();) {
    if (done[first]) {
      ++first;
      continue;
    }
    // One launch for up to kMaxGroupedProducts products of this weight type.
    GroupedBatch batch;
    int64_t max_tokens = 0;
    for (size_t i = first; i < products.size() && batch.n < kMaxGroupedProducts; ++i)
      if (!done[i] && types[i] == types[first]) {
        batch.p[batch.n++] = products[i];
        max_tokens = std::max(max_tokens, products[i].n_tok);
        done[i] = true;
      }
    const int64_t blocks = grouped_layout(&batch);
    const bool int8 = batch.p[0].xq != nullptr;  // by type: all of a type or none
    MOELITE_TRY(k_->grouped_matmul(compute_, types[first], batch, blocks, max_tokens, gate_up, int8, act_mode(),
                                   pass_kind_.alpha, pass_kind_.limit));
  }
  return MOELITE_OK;
}

void* CudaBackend::alloc_shared(uint64_t bytes) {
  void *h = nullptr, *d = nullptr;
  if (rt_->host_alloc_mapped(bytes, &h, &d) != MOELITE_OK) {
    clear_error();
    return nullptr;  // the store falls back to ordinary memory; experts are then copied in
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->blocks.push_back({static_cast<uint8_t*>(h), static_cast<uint8_t*>(d), bytes});
  return h;
}

void CudaBackend::free_shared(void* p) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  std::vector<SharedBlock>& blocks = shared_->blocks;
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].host == p) {
      (void)rt_->stream_sync(copy_);
      (void)rt_->stream_sync(compute_);
      rt_->host_free_mapped(p);
      blocks.erase(blocks.begin() + static_cast<long>(i));
      return;
    }
}

const uint8_t* CudaBackend::shared_device_address(const uint8_t* host) const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (const SharedBlock& b : shared_->blocks)
    if (host >= b.host && host < b.host + b.bytes) return b.dev + (host - b.host);
  return nullptr;
}

Status CudaBackend::check_weight(const WeightView& w) {
  if (!k_->supports(w.type))
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "the CUDA backend has no kernel for weight type %s", type_name(w.type));
  return MOELITE_OK;
}

Status CudaBackend::place_weight(const WeightView& w) {
  MOELITE_TRY(check_weight(w));
  WeightArg a;
  return device_weight(w, &a);
}

Status CudaBackend::device_weight(const WeightView& w, WeightArg* out) {
  if (!w.valid()) return fail(MOELITE_ERR_INTERNAL, "CUDA backend: a weight without host bytes");
  // Held through the upload, so two peers never copy the same weight.
  std::lock_guard<std::mutex> lock(shared_->mu);
  std::unordered_map<const void*, DevBytes>& weights = shared_->weights;
  auto it = weights.find(w.data);
  if (it == weights.end() || it->second.bytes < w.bytes()) {
    if (it != weights.end()) {
      // The same address seen with fewer rows before: replace the copy. device_free waits for the
      // device, so no queued kernel of any stream still reads it.
      rt_->device_free(it->second.dev);
      weights.erase(it);
    }
    MOELITE_TRY(check_weight(w));
    DevBytes d;
    d.bytes = w.bytes();
    MOELITE_TRY(rt_->device_alloc(padded_to_vec16(d.bytes), &d.dev));
    // Complete before it is in the map: a peer's stream may read it as soon as it is found, and
    // a copy that fails is never found. The copy stream holds only tier copies, which the compute
    // stream waits for anyway; the compute stream is not waited for.
    Status st = rt_->copy_async(d.dev, w.data, d.bytes, copy_);
    if (st == MOELITE_OK) st = wait(copy_);
    if (st != MOELITE_OK) {
      rt_->device_free(d.dev);
      return st;
    }
    it = weights.emplace(w.data, d).first;
  }
  *out = arg_of(w, it->second.dev);
  return MOELITE_OK;
}

Status CudaBackend::device_floats(const float* p, size_t n, const float** out) {
  *out = nullptr;
  if (!p) return MOELITE_OK;
  WeightView v;
  v.type = TensorType::F32;
  v.cols = static_cast<int64_t>(n);
  v.rows = 1;
  v.row_bytes = n * sizeof(float);
  v.data = reinterpret_cast<const uint8_t*>(p);
  WeightArg a;
  MOELITE_TRY(device_weight(v, &a));
  *out = reinterpret_cast<const float*>(a.data);
  return MOELITE_OK;
}

Status CudaBackend::alloc_act(int64_t rows, int64_t cols, Act* out) {
  if (rows <= 0 || cols <= 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "empty activation");
  void* p;
  MOELITE_TRY(rt_->device_alloc(static_cast<size_t>(rows) * static_cast<size_t>(cols) * sizeof(float), &p));
  *out = Act{p, rows, cols};
  return MOELITE_OK;
}

void CudaBackend::free_act(Act* a) {
  rt_->device_free(a->handle);
  *a = Act{};
}

Act CudaBackend::view_rows(const Act& a, int64_t row0, int64_t n) { return Act{floats(a) + row0 * a.cols, n, a.cols}; }

Status CudaBackend::read_rows(const Act& a, int64_t row0, int64_t n, float* dst) {
  MOELITE_TRY(
      rt_->copy_async(dst, floats(a) + row0 * a.cols, static_cast<size_t>(n * a.cols) * sizeof(float), compute_));
  return sync();
}

Status CudaBackend::read_kv(const KvCache& kv, int32_t layer, int32_t slot0, int32_t n, float* keys, float* values) {
  MOELITE_TRY(kv_check_slots(kv, layer, slot0, n));
  const auto* ref = static_cast<const KvRef*>(kv.handle);
  const size_t off = static_cast<size_t>(slot0) * static_cast<size_t>(kv.kv_dim);
  const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(kv.kv_dim) * sizeof(float);
  MOELITE_TRY(rt_->copy_async(keys, ref->k[static_cast<size_t>(layer)] + off, bytes, compute_));
  if (kv.values) MOELITE_TRY(rt_->copy_async(values, ref->v[static_cast<size_t>(layer)] + off, bytes, compute_));
  return sync();
}

Status CudaBackend::write_kv(KvCache* kv, int32_t layer, int32_t slot0, int32_t n, const float* keys,
                             const float* values) {
  MOELITE_TRY(kv_check_slots(*kv, layer, slot0, n));
  const auto* ref = static_cast<const KvRef*>(kv->handle);
  const size_t off = static_cast<size_t>(slot0) * static_cast<size_t>(kv->kv_dim);
  const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(kv->kv_dim) * sizeof(float);
  MOELITE_TRY(rt_->copy_async(ref->k[static_cast<size_t>(layer)] + off, keys, bytes, compute_));
  if (kv->values) MOELITE_TRY(rt_->copy_async(ref->v[static_cast<size_t>(layer)] + off, values, bytes, compute_));
  return sync();  // the host rows may be freed once this returns
}

Status CudaBackend::alloc_kv(int32_t n_ctx, const std::vector<int32_t>& slots, int64_t kv_dim, bool values,
                             KvCache* out) {
  KvCache made = kv_cache_shape(n_ctx, slots, kv_dim, values);  // may throw; nothing is allocated yet
  auto kv = std::make_unique<KvRef>();
  kv->k.reserve(slots.size());  // so that no push_back can throw after its allocation
  kv->v.reserve(slots.size());
  for (const int32_t n : slots) {
    const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(kv_dim) * sizeof(float);
    for (std::vector<float*>* side : {&kv->k, &kv->v}) {
      if (side == &kv->v && !values) continue;
      void* p;
      if (Status st = rt_->device_alloc(bytes, &p); st != MOELITE_OK) {
        KvCache partial;
        partial.handle = kv.release();
        free_kv(&partial);
        return st;
      }
      side->push_back(static_cast<float*>(p));
    }
  }
  made.handle = kv.release();
  *out = std::move(made);
  return MOELITE_OK;
}

void CudaBackend::free_kv(KvCache* kv) {
  auto* ref = static_cast<KvRef*>(kv->handle);
  if (ref) {
    for (float* p : ref->k) rt_->device_free(p);
    for (float* p : ref->v) rt_->device_free(p);
    delete ref;
  }
  *kv = KvCache{};
}

Status CudaBackend::wait(StreamHandle s) {
  const Status st = rt_->stream_sync(s);
  if (st != MOELITE_OK) forget_tier();
  return st;
}

void CudaBackend::forget_tier() {
  std::lock_guard<std::mutex> lock(shared_->tier_mu);
  (void)release_tier_slots_locked();
  for (TierSlot& slot : shared_->tier) {
    if (slot.holder) continue;  // a peer's: its own evaluation decides
    slot.layer = slot.expert = -1;
    for (bool& h : slot.has) h = false;
  }
}

Status CudaBackend::release_tier_slots_locked() {
  Status st = MOELITE_OK;
  for (TierSlot& s : shared_->tier) {
    if (s.holder != this) continue;
    Status made = s.released ? MOELITE_OK : rt_->event_create(&s.released);
    if (made == MOELITE_OK) made = rt_->event_record(s.released, compute_);
    if (made != MOELITE_OK) {
      // Kept: a slot whose release cannot be ordered after its readers is never copied into again.
      if (st == MOELITE_OK) st = made;
      continue;
    }
    s.holder = nullptr;
  }
  return st;
}

Status CudaBackend::sync() {
  Status st = wait(copy_);
  const Status compute = wait(compute_);
  if (st == MOELITE_OK) st = compute;
  arena_reset(&uploads_);  // nothing queued reads the uploads or tables any more
  arena_reset(&tables_);
  return st;
}

Status CudaBackend::measure_memory_bandwidth(double* gb_per_s) {
  // Device-to-device copies of a buffer larger than any cache, timed on the host around a
  // synchronisation: the best of a few rounds, counting each byte read and written.
  const size_t bytes = rt_->info().emulated ? size_t{64} << 20 : size_t{256} << 20;
  MOELITE_TRY(sync());
  void *a = nullptr, *b = nullptr;
  MOELITE_TRY(rt_->device_alloc(bytes, &a));
  Status st = rt_->device_alloc(bytes, &b);
  double best = 0.0;
  for (int round = 0; round < 5 && st == MOELITE_OK; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4 && st == MOELITE_OK; ++i) st = rt_->copy_async(i % 2 ? a : b, i % 2 ? b : a, bytes, compute_);
    if (st == MOELITE_OK) st = rt_->stream_sync(compute_);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (st == MOELITE_OK && s > 0) best = std::max(best, 4.0 * 2.0 * static_cast<double>(bytes) / s / 1e9);
  }
  rt_->device_free(b);
  rt_->device_free(a);
  MOELITE_TRY(st);
  *gb_per_s = best;
  return MOELITE_OK;
}

// ---- dense operations

Status CudaBackend::get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) {
  WeightArg w;
  MOELITE_TRY(device_weight(table, &w));
  const void* ids;
  MOELITE_TRY(upload(tokens, static_cast<size_t>(n) * sizeof(int32_t), &ids));
  return k_->get_rows(compute_, w, static_cast<const int32_t*>(ids), n, floats(*out));
}

Status CudaBackend::rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) {
  const float* dw;
  MOELITE_TRY(device_floats(w, static_cast<size_t>(group), &dw));
  return k_->rms_norm(compute_, floats(x), dw, x.rows, x.cols, group, eps, floats(*out));
}

int CudaBackend::int8_format(TensorType t) const {
  return int8_ ? cuda_kernels::act_format_of(static_cast<int>(t)) : -1;
}

Status CudaBackend::quantize_rows(int format, const float* x, int64_t x_stride, const int32_t* x_map, int64_t n,
                                  int64_t cols, const uint8_t** out) {
  const int64_t bytes = n * cuda_kernels::act_row_layout(format, cols).bytes;
  float* buf;
  MOELITE_TRY(scratch(static_cast<size_t>((bytes + 3) / 4), &buf));
  MOELITE_TRY(k_->quantize_act(compute_, format, x, x_stride, x_map, n, cols, reinterpret_cast<uint8_t*>(buf)));
  *out = reinterpret_cast<const uint8_t*>(buf);
  return MOELITE_OK;
}

Status CudaBackend::pass_quantized(int format, const uint8_t** out) {
  if (!pass_q_[format]) MOELITE_TRY(quantize_rows(format, pass_x_, pass_cols_, nullptr, pass_n_, pass_cols_, &pass_q_[format]));
  *out = pass_q_[format];
  return MOELITE_OK;
}

Status CudaBackend::matmul_rows(const WeightArg& w, const float* x, int64_t x_stride, const int32_t* x_map, float* y,
                                int64_t y_stride, const int32_t* y_map, int64_t n, const float* bias) {
  MatmulArgs a;
  a.w = w;
  a.x = x;
  a.x_stride = x_stride;
  a.x_map = x_map;
  if (const int format = int8_format(w.type); format >= 0 && n > 0) {
    // The integer product reads the rows quantized (through the map: its own rows are in order).
    MOELITE_TRY(quantize_rows(format, x, x_stride, x_map, n, w.cols, &a.xq));
    a.x_map = nullptr;
  }
  a.y = y;
  a.y_stride = y_stride;
  a.y_map = y_map;
  a.n_tok = n;
  a.bias = bias;
  return k_->matmul(compute_, a);
}

Status CudaBackend::matmul(const WeightView& w, const Act& x, const float* bias, Act* out) {
  WeightArg dw;
  MOELITE_TRY(device_weight(w, &dw));
  const float* db;
  MOELITE_TRY(device_floats(bias, static_cast<size_t>(w.rows), &db));
  return matmul_rows(dw, floats(x), x.cols, nullptr, floats(*out), out->cols, nullptr, x.rows, db);
}

Status CudaBackend::add(Act* x, const Act& y) { return k_->add(compute_, floats(*x), floats(y), x->rows * x->cols); }
Status CudaBackend::scale(Act* x, float s) { return k_->scale(compute_, floats(*x), s, x->rows * x->cols); }
Status CudaBackend::add_bias(Act* x, const float* bias) {
  const float* b;
  MOELITE_TRY(device_floats(bias, static_cast<size_t>(x->cols), &b));
  return k_->add_bias(compute_, floats(*x), b, x->rows, x->cols);
}

Status CudaBackend::rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) {
  const std::vector<float> cs = rope_cos_sin_table(static_cast<double>(p.freq_base), p.n_rot, p.scaling, positions, x->rows);
  const void* angles;
  MOELITE_TRY(upload(cs.data(), cs.size() * sizeof(float), &angles));
  return k_->rope(compute_, floats(*x), x->rows, x->cols, head_dim, p.n_rot, p.style == RopeStyle::Neox,
                  static_cast<const float*>(angles));
}

Status CudaBackend::copy_columns(const Act& x, int64_t x_stride, int64_t x_offset, int32_t n_groups, int64_t width,
                                 Act* out, int64_t out_stride, int64_t out_offset) {
  MOELITE_TRY(check_copy_columns(x, x_stride, x_offset, n_groups, width, *out, out_stride, out_offset));
  return k_->copy_columns(compute_, floats(x), x.cols, x_stride, x_offset, floats(*out), out->cols, out_stride,
                          out_offset, x.rows, n_groups, width);
}

Status CudaBackend::attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0,
                              int32_t n_head, int32_t n_head_kv, int64_t head_dim, const AttentionSpec& spec,
                              Act* out) {
  MOELITE_TRY(kv_check_batch(*kv, layer, pos0, q.rows, spec));
  int64_t head_dim_v = 0;
  MOELITE_TRY(kv_value_width(*kv, spec, head_dim, &head_dim_v));
  auto* ref = static_cast<KvRef*>(kv->handle);
  float* ck = ref->k[static_cast<size_t>(layer)];
  float* cv = kv->values ? ref->v[static_cast<size_t>(layer)] : ck;  // keys-only: values lead each key
  const int32_t slots = kv->slots[static_cast<size_t>(layer)];
  const size_t row_bytes = static_cast<size_t>(kv->kv_dim) * sizeof(float);
  // The batch's rows in at most two runs: a sliding-window layer's ring may wrap once.
  for (int64_t r0 = 0; r0 < k.rows;) {
    const int64_t slot = kv_slot(pos0 + r0, slots), run = std::min<int64_t>(k.rows - r0, slots - slot);
    MOELITE_TRY(rt_->copy_async(ck + slot * kv->kv_dim, floats(k) + r0 * kv->kv_dim, static_cast<size_t>(run) * row_bytes,
                                compute_));
    if (kv->values)
      MOELITE_TRY(rt_->copy_async(cv + slot * kv->kv_dim, floats(v) + r0 * kv->kv_dim,
                                  static_cast<size_t>(run) * row_bytes, compute_));
    r0 += run;
  }
  const float* sinks;
  MOELITE_TRY(device_floats(spec.sinks, static_cast<size_t>(n_head), &sinks));
  // Tokens in slices, so the chunks' partial results stay small however long the prompt.
  constexpr int64_t kSlice = 64;
  const int64_t slice = std::min<int64_t>(q.rows, kSlice);
  const size_t need = static_cast<size_t>(slice) * static_cast<size_t>(n_head) *
                      static_cast<size_t>(attention_chunks(pos0 + static_cast<int32_t>(q.rows))) *
                      static_cast<size_t>(head_dim_v + 2);
  if (need > attn_partial_floats_) {
    rt_->device_free(attn_partial_);
    attn_partial_ = nullptr;
    attn_partial_floats_ = 0;
    void* p;
    MOELITE_TRY(rt_->device_alloc(need * sizeof(float), &p));
    attn_partial_ = static_cast<float*>(p);
    attn_partial_floats_ = need;
  }
  const float scale = spec.scale > 0.0f ? spec.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t q_dim = static_cast<int64_t>(n_head) * head_dim, o_dim = static_cast<int64_t>(n_head) * head_dim_v;
  for (int64_t t0 = 0; t0 < q.rows; t0 += slice) {
    const int32_t n = static_cast<int32_t>(std::min(slice, q.rows - t0));
    MOELITE_TRY(k_->attention(compute_, floats(q) + t0 * q_dim, ck, cv, floats(*out) + t0 * o_dim, attn_partial_, n,
                              pos0 + static_cast<int32_t>(t0), n_head, n_head_kv, head_dim, head_dim_v, kv->kv_dim, slots,
                              std::max(0, spec.window), sinks, scale));
  }
  return MOELITE_OK;
}

Status CudaBackend::route(const Act& logits, int32_t k, bool renormalize, Routing* r) {
  const size_t n = static_cast<size_t>(logits.rows) * static_cast<size_t>(k);
  void *ids_h, *ids_d, *w_h, *w_d;
  MOELITE_TRY(arena_take(&uploads_, n * sizeof(int32_t), &ids_h, &ids_d));
  MOELITE_TRY(arena_take(&uploads_, n * sizeof(float), &w_h, &w_d));
  MOELITE_TRY(k_->route(compute_, floats(logits), logits.rows, static_cast<int32_t>(logits.cols), k, renormalize,
                        static_cast<int32_t*>(ids_d), static_cast<float*>(w_d)));
  // Only the chosen ids and weights come back, through pinned memory the kernel wrote.
  MOELITE_TRY(wait(compute_));
  r->n_tokens = static_cast<int32_t>(logits.rows);
  r->k = k;
  r->ids.assign(static_cast<int32_t*>(ids_h), static_cast<int32_t*>(ids_h) + n);
  r->weights.assign(static_cast<float*>(w_h), static_cast<float*>(w_h) + n);
  return MOELITE_OK;
}

Status CudaBackend::gate_up_product(const ExpertWeights& w, const WeightArg& gate, const WeightArg& up, const float* x,
                                    int64_t x_stride, const int32_t* x_map, int64_t n, float* h,
                                    GroupedProduct* out) {
  GroupedProduct p = product_of(gate);
  p.w_up = up.data;
  MOELITE_TRY(device_floats(w.gate_bias, static_cast<size_t>(gate.rows), &p.bias));
  MOELITE_TRY(device_floats(w.up_bias, static_cast<size_t>(up.rows), &p.bias_up));
  p.x = x;
  p.x_stride = x_stride;
  p.x_map = x_map;
  p.y = h;
  p.y_stride = gate.rows;
  p.n_tok = n;
  *out = p;
  return MOELITE_OK;
}

bool CudaBackend::fusable(const WeightArg& gate, const WeightArg& up) {
  return up.type == gate.type && up.rows == gate.rows && up.cols == gate.cols && up.row_bytes == gate.row_bytes;
}

Status CudaBackend::separate_gate_up(const GroupedProduct& p, const WeightArg& gate, const WeightArg& up) {
  // Gate and up of different types (a mixed quantization): two products and the activation, the
  // values the fused kernel gives for equal types.
  float *g, *u;
  MOELITE_TRY(scratch(static_cast<size_t>(p.n_tok * gate.rows), &g));
  MOELITE_TRY(scratch(static_cast<size_t>(p.n_tok * up.rows), &u));
  MOELITE_TRY(matmul_rows(gate, p.x, p.x_stride, p.x_map, g, gate.rows, nullptr, p.n_tok, p.bias));
  MOELITE_TRY(matmul_rows(up, p.x, p.x_stride, p.x_map, u, up.rows, nullptr, p.n_tok, p.bias_up));
  return k_->ffn_act(compute_, g, u, p.y, p.n_tok * gate.rows, act_mode(), pass_kind_.alpha, pass_kind_.limit);
}

Status CudaBackend::dense_ffn(const ExpertWeights& w, const FfnKind& kind, const float* gate_inp, const Act& x,
                              Act* out) {
  arena_reset(&scratch_);  // in stream order behind every earlier use
  pass_kind_ = kind;
  WeightArg gate, up, down;
  MOELITE_TRY(device_weight(w.gate, &gate));
  MOELITE_TRY(device_weight(w.up, &up));
  MOELITE_TRY(device_weight(w.down, &down));
  float* h;
  MOELITE_TRY(scratch(static_cast<size_t>(x.rows * gate.rows), &h));
  std::vector<GroupedProduct> first_half(1);
  MOELITE_TRY(gate_up_product(w, gate, up, floats(x), x.cols, nullptr, x.rows, h, first_half.data()));
  if (fusable(gate, up)) {
    if (const int format = int8_format(gate.type); format >= 0)
      MOELITE_TRY(quantize_rows(format, floats(x), x.cols, nullptr, x.rows, x.cols, &first_half[0].xq));
    MOELITE_TRY(launch_grouped(first_half, {gate.type}, true));
  } else {
    MOELITE_TRY(separate_gate_up(first_half[0], gate, up));
  }
  const float* db;
  MOELITE_TRY(device_floats(w.down_bias, static_cast<size_t>(down.rows), &db));
  MOELITE_TRY(matmul_rows(down, h, gate.rows, nullptr, floats(*out), out->cols, nullptr, x.rows, db));
  if (!gate_inp) return MOELITE_OK;
  const float* gi;
  MOELITE_TRY(device_floats(gate_inp, static_cast<size_t>(x.cols), &gi));
  WeightArg gw;
  gw.type = TensorType::F32;
  gw.data = reinterpret_cast<const uint8_t*>(gi);
  gw.row_bytes = static_cast<uint64_t>(x.cols) * sizeof(float);
  gw.rows = 1;
  gw.cols = x.cols;
  float* s;
  MOELITE_TRY(scratch(static_cast<size_t>(x.rows), &s));
  MOELITE_TRY(matmul_rows(gw, floats(x), x.cols, nullptr, s, 1, nullptr, x.rows, nullptr));
  return k_->sigmoid_scale(compute_, floats(*out), s, out->rows, out->cols);
}

// ---- routed experts

Status CudaBackend::moe_begin(const Act& x, const FfnKind& kind, int64_t n_out_rows) {
  arena_reset(&scratch_);
  pending_.clear();
  pass_x_ = floats(x);
  pass_cols_ = x.cols;
  pass_n_ = x.rows;
  for (const uint8_t*& q : pass_q_) q = nullptr;
  pass_kind_ = kind;
  const int64_t need = n_out_rows * x.cols;
  if (need > pass_rows_) {
    rt_->device_free(pass_out_);
    pass_out_ = nullptr;
    pass_rows_ = 0;
    void* p;
    MOELITE_TRY(rt_->device_alloc(static_cast<size_t>(need) * sizeof(float), &p));
    pass_out_ = static_cast<float*>(p);
    pass_rows_ = need;
  }
  return MOELITE_OK;
}

Status CudaBackend::wait_for_copy(EventHandle e) { return rt_->stream_wait(compute_, e); }

Status CudaBackend::tier_matrix(const ExpertTask& t, int which, WeightArg* out) {
  const WeightView& w = which == 0 ? t.w.gate : which == 1 ? t.w.up : t.w.down;
  std::unique_lock<std::mutex> lock(shared_->tier_mu);
  std::vector<TierSlot>& tier = shared_->tier;
  if (tier.empty()) tier.resize(static_cast<size_t>(std::max<int64_t>(tier_slots_, 1)));
  TierPick pick;
  while ((pick = pick_tier_slot(tier, &shared_->tier_clock, t.layer, t.expert, this)).kind ==
         TierPick::ReleaseOwnFirst) {
    // Every slot peers do not hold is this pass's: release them. The kernels queued so far that
    // read them run before any copy into them (the release event).
    MOELITE_TRY(release_tier_slots_locked());
  }
  if (pick.kind == TierPick::OwnCopy) {
    lock.unlock();  // a peer's pass reads the slot (and may still copy into it): no waiting for peers
    ++tier_own_copies_;
    return own_copy(w, out);
  }
  TierSlot* slot = &tier[pick.index];
  if (pick.reassigned)
    for (bool& h : slot->has) h = false;
  // Copies into a slot taken from no holder follow its last holder's kernels.
  const EventHandle released = pick.taken ? slot->released : nullptr;
  lock.unlock();  // held: no other instance copies into the slot or reads it until released
  if (released) MOELITE_TRY(rt_->stream_wait(copy_, released));
  ++(slot->has[which] ? tier_hits_ : tier_loads_);
  if (!slot->has[which]) {
    if (slot->capacity[which] < w.bytes()) {
      rt_->device_free(slot->chunk[which]);  // waits for the device, so no reader is left
      slot->chunk[which] = nullptr;
      slot->capacity[which] = 0;
      void* p;
      MOELITE_TRY(rt_->device_alloc(padded_to_vec16(w.bytes()), &p));
      slot->chunk[which] = static_cast<uint8_t*>(p);
      slot->capacity[which] = w.bytes();
    }
    if (!slot->copied[which]) MOELITE_TRY(rt_->event_create(&slot->copied[which]));
    MOELITE_TRY(rt_->copy_async(slot->chunk[which], w.data, w.bytes(), copy_));
    MOELITE_TRY(rt_->event_record(slot->copied[which], copy_));
    slot->has[which] = true;
  }
  // Compute waits only for the copy of the matrix it reads (this instance's or a former holder's).
  MOELITE_TRY(wait_for_copy(slot->copied[which]));
  *out = arg_of(w, slot->chunk[which]);
  return MOELITE_OK;
}

Status CudaBackend::own_copy(const WeightView& w, WeightArg* out) {
  // Scratch is reused in compute-stream order, and this copy runs on the copy stream (drained at
  // the round end, before the store may refill the host slot): after the kernels queued so far.
  float* dst;
  MOELITE_TRY(scratch((padded_to_vec16(w.bytes()) + sizeof(float) - 1) / sizeof(float), &dst));
  MOELITE_TRY(rt_->event_record(compute_point_, compute_));
  MOELITE_TRY(rt_->stream_wait(copy_, compute_point_));
  MOELITE_TRY(rt_->copy_async(dst, w.data, w.bytes(), copy_));
  if (!own_copied_) MOELITE_TRY(rt_->event_create(&own_copied_));
  MOELITE_TRY(rt_->event_record(own_copied_, copy_));
  MOELITE_TRY(rt_->stream_wait(compute_, own_copied_));
  *out = arg_of(w, dst);
  return MOELITE_OK;
}

Status CudaBackend::expert_matrix(const ExpertTask& t, int which, WeightArg* out) {
  const WeightView& w = which == 0 ? t.w.gate : which == 1 ? t.w.up : t.w.down;
  MOELITE_TRY(check_weight(w));
  if (t.resident) return device_weight(w, out);
  if (rt_->info().integrated) {
    if (const uint8_t* dev = shared_device_address(w.data)) {
      *out = arg_of(w, dev);  // zero copy: the kernel reads the store's slot
      return MOELITE_OK;
    }
  }
  return tier_matrix(t, which, out);
}

Status CudaBackend::expert_gate_up(const ExpertTask* tasks, int32_t n_tasks) {
  pending_.clear();
  // Every task's row maps, the input rows it reads here and the output rows its down product
  // writes, in one table copied before any product that reads it is queued: one copy a round.
  size_t map_ints = 0;
  for (int32_t i = 0; i < n_tasks; ++i) map_ints += static_cast<size_t>(std::max(tasks[i].n_rows, 0));
  const int32_t* maps = nullptr;
  if (map_ints > 0) {
    void *host, *dev;
    MOELITE_TRY(take_table(2 * map_ints * sizeof(int32_t), &host, &dev));
    size_t at = 0;
    for (int32_t i = 0; i < n_tasks; ++i) {
      const size_t n = static_cast<size_t>(std::max(tasks[i].n_rows, 0));
      if (n == 0) continue;
      std::memcpy(static_cast<int32_t*>(host) + at, tasks[i].x_rows, n * sizeof(int32_t));
      std::memcpy(static_cast<int32_t*>(host) + map_ints + at, tasks[i].out_rows, n * sizeof(int32_t));
      at += n;
    }
    MOELITE_TRY(commit_table(host, dev, 2 * map_ints * sizeof(int32_t)));
    maps = static_cast<const int32_t*>(dev);
  }
  GateUpLaunch launch;
  size_t at = 0;
  for (int32_t i = 0; i < n_tasks; ++i) {
    const ExpertTask& t = tasks[i];
    WeightArg gate, up;
    MOELITE_TRY(expert_matrix(t, 0, &gate));
    MOELITE_TRY(expert_matrix(t, 1, &up));
    // The down matrix is not touched here: the store may still be reading it (core waits for it
    // between the two halves). Its copy, queued in expert_down, still overlaps these kernels.
    PendingTask p;
    p.ff = gate.rows;
    p.rows = std::max<int64_t>(t.n_rows, 0);
    p.out_map = maps ? maps + map_ints + at : nullptr;
    MOELITE_TRY(scratch(static_cast<size_t>(p.rows * p.ff), &p.h));
    GroupedProduct g;
    MOELITE_TRY(gate_up_product(t.w, gate, up, pass_x_, pass_cols_, maps ? maps + at : nullptr, t.n_rows, p.h, &g));
    if (const int format = int8_format(gate.type); format >= 0 && fusable(gate, up))
      MOELITE_TRY(pass_quantized(format, &g.xq));  // the pass's rows, through the task's map
    at += static_cast<size_t>(std::max(t.n_rows, 0));
    launch.add(g, gate, up);
    pending_.push_back(p);
    // A budgeted expert's matrices may sit in device tier slots that a later task's copy would
    // overwrite (tier_matrix orders that copy after the kernels queued so far): its product is
    // queued now. (Budgeted experts come one a call from the executor anyway.)
    if (!t.resident) MOELITE_TRY(flush_gate_up(&launch));
  }
  return flush_gate_up(&launch);
}

Status CudaBackend::flush_gate_up(GateUpLaunch* l) {
  for (const GateUpLaunch::Separate& sp : l->separate) MOELITE_TRY(separate_gate_up(sp.p, sp.gate, sp.up));
  l->separate.clear();
  const Status st = launch_grouped(l->products, l->types, true);
  l->products.clear();
  l->types.clear();
  return st;
}

Status CudaBackend::expert_down(const ExpertTask* tasks, int32_t n_tasks) {
  if (static_cast<size_t>(n_tasks) != pending_.size())
    return fail(MOELITE_ERR_INTERNAL, "CUDA backend: expert_down for %d tasks after expert_gate_up for %zu", n_tasks,
                pending_.size());
  std::vector<GroupedProduct> products;
  std::vector<TensorType> types;
  for (int32_t i = 0; i < n_tasks; ++i) {
    const ExpertTask& t = tasks[i];
    WeightArg down;
    MOELITE_TRY(expert_matrix(t, 2, &down));
    GroupedProduct d = product_of(down);
    MOELITE_TRY(device_floats(t.w.down_bias, static_cast<size_t>(down.rows), &d.bias));
    const PendingTask& p = pending_[static_cast<size_t>(i)];
    d.x = p.h;
    d.x_stride = p.ff;
    if (const int format = int8_format(down.type); format >= 0 && p.rows > 0)
      MOELITE_TRY(quantize_rows(format, p.h, p.ff, nullptr, p.rows, p.ff, &d.xq));
    d.y = pass_out_;
    d.y_stride = pass_cols_;
    d.y_map = p.out_map;
    d.n_tok = t.n_rows;
    products.push_back(d);
    types.push_back(down.type);
    if (!t.resident) {  // as in expert_gate_up: queued before a later copy may reuse its tier slot
      MOELITE_TRY(launch_grouped(products, types, false));
      products.clear();
      types.clear();
    }
  }
  return launch_grouped(products, types, false);
}

Status CudaBackend::expert_round_end() {
  // When this returns the store may refill the round's slots: every copy out of them (discrete)
  // and every kernel reading them in place (integrated) must have run.
  MOELITE_TRY(wait(copy_));
  if (rt_->info().integrated) MOELITE_TRY(wait(compute_));
  std::lock_guard<std::mutex> lock(shared_->tier_mu);
  return release_tier_slots_locked();  // copies into them will wait for the kernels reading them
}

Status CudaBackend::moe_combine(const Routing& r, Act* out) {
  const size_t n = static_cast<size_t>(r.n_tokens) * static_cast<size_t>(r.k);
  if (n == 0) return MOELITE_OK;
  // Every thread reads every slot's id and weight: a table in device memory.
  void *host, *dev;
  MOELITE_TRY(take_table(n * (sizeof(int32_t) + sizeof(float)), &host, &dev));
  std::memcpy(host, r.ids.data(), n * sizeof(int32_t));
  std::memcpy(static_cast<int32_t*>(host) + n, r.weights.data(), n * sizeof(float));
  MOELITE_TRY(commit_table(host, dev, n * (sizeof(int32_t) + sizeof(float))));
  const int32_t* ids = static_cast<const int32_t*>(dev);
  return k_->combine(compute_, pass_out_, ids, reinterpret_cast<const float*>(ids + n), r.n_tokens, r.k, out->cols,
                     floats(*out));
}

}  // namespace moelite::cuda
