#include "backends/cpu/cpu_backend.h"
#include "base/options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "backends/column_copy.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/kv_layout.h"
#include "platforms/platform.h"
#include "platforms/system_info.h"

namespace moelite::cpu {

// Activation rows as a dot kernel reads them: `stride` bytes apart, and where the table has a
// prepared tile for the weight type and the batch uses it, the same rows in the prepared layout.
struct ActRows {
  const uint8_t* data;
  size_t stride;
  const uint8_t* prepared = nullptr;
  size_t prepared_stride = 0;
  ActRows at(int64_t row) const {
    return {data + static_cast<size_t>(row) * stride, stride,
            prepared ? prepared + static_cast<size_t>(row) * prepared_stride : nullptr, prepared_stride};
  }
};

namespace {

float* rows_of(const Act& a) { return static_cast<float*>(a.handle); }

// One allocation per layer and side: a sliding-window layer holds fewer positions than the rest.
struct KvStorage {
  std::vector<float*> k, v;
  ~KvStorage() {
    for (float* p : k) platform::aligned_free(p);
    for (float* p : v) platform::aligned_free(p);
  }
};

// Row-chunk size for splitting `rows` outputs (of one matrix, or of all the jobs of a call) over
// `threads`: about four chunks per thread so dynamic scheduling evens out, but as long as that
// allows (up to 1024 rows), because every task starts its weight streams afresh and Zen 4's
// prefetcher needs a run to ramp up. On 2 threads (OLMoE-shaped Q8_0 model, same run): chunks
// capped at 64 rows per matrix gave prefill 178-211 / decode 47-53 tok/s, four chunks per thread
// over the whole call (an expert of a decode step or of a 64-token prefill is then one task)
// 214-220 / 49-63. `step` rows are computed together (kTileRows or kQuadRows where the kernel
// table has a tile for the weight type, else 1), so chunks are a multiple of it and only a
// matrix's last rows can be left alone.
int64_t row_chunk(int64_t rows, int threads, int step) {
  constexpr int64_t kTasksPerThread = 4, kMaxChunkRows = 1024;
  const int64_t chunk = std::clamp<int64_t>(rows / (static_cast<int64_t>(threads) * kTasksPerThread), 1, kMaxChunkRows);
  return (chunk + step - 1) / step * step;
}

// Rows per step of the matmul loops: fours or pairs where the table has such a tile for the type.
// With a single activation row (decode) the weights stream from DRAM and the kernel's speed
// matters less than how well the hardware prefetcher follows the reads. On x86 decode takes one
// row at a time: on Zen 4 one thread streaming a 136 MB Q8_0 matrix made 24.3 GB/s row by row,
// 22.5 with the avx512 2-row tile (rows apart), 21.8 with the 4-row one, and decode of the
// OLMoE-shaped model 49.1 vs 47.0 tok/s (tiles are what batches use: 4 activation rows per call
// 16.4 -> 18.6 GB/s of weights with the 4-row tile). AArch64 keeps its SMMLA tiles in decode.
// MOELITE_DECODE_TILES=0/1 overrides.
int g_decode_tiles = [] {
  bool tiles;
  if (option_flag(Option::DecodeTiles, &tiles)) return tiles ? 1 : 0;
#if defined(__x86_64__) || defined(__i386__)
  return 0;
#else
  return 1;
#endif
}();
// Batches of at least MatrixTile::min_tokens activation rows take the table's matrix tile (AMX)
// where it has one for the type; fewer go through vec_dot and multi-dots, which give the same bits.
// MOELITE_MATRIX_MIN_TOKENS replaces every table's threshold (for measuring).
int g_matrix_min_tokens_override = [] {
  int64_t v;
  if (option_int(Option::MatrixMinTokens, &v)) return static_cast<int>(v);
  return 0;
}();
int matrix_min_tokens(const MatrixTile& m) {
  return g_matrix_min_tokens_override > 0 ? g_matrix_min_tokens_override : m.min_tokens;
}
// Weights with grouped copies keep them (the group kernel reads those; Q4_K and Q5_K on x86): the
// matrix tile is for weights in row layout, i.e. expert-store slots and types without groups.
bool use_matrix(const KernelTable& k, TensorType type, int64_t max_tokens, bool grouped) {
  const MatrixTile& m = k.matrix[static_cast<uint32_t>(type)];
  return m.dot && !grouped && max_tokens >= matrix_min_tokens(m);
}

// Types with a group kernel (interleaved_rows.h) take rows in groups of kGroupRows (pairs of
// groups, kGroupPairRows, where the table's kernel takes two a call), in decode and in batches:
// grouped copies go through the group kernel, weights in row layout (expert-store slots) one row
// at a time, in the same order as step 1.
// (Batches that take a matrix tile never get here: use_matrix sends them to their own loops.)
int row_step(const KernelTable& k, TensorType type, int64_t max_tokens = 2) {
  const RowGroups& groups = k.groups[static_cast<uint32_t>(type)];
  if (groups.dot) return groups.dot_pair ? kGroupPairRows : kGroupRows;
  if (max_tokens <= 1 && !g_decode_tiles) return 1;
  if (k.tile4[static_cast<uint32_t>(type)]) return kQuadRows;
  return k.tile[static_cast<uint32_t>(type)] ? kTileRows : 1;
}

// The dot kernels of one weight matrix, looked up once per task. rows<NR>(r, dr, ...) computes
// weight rows r, r + dr, ... (NR = 1, kTileRows or kQuadRows rows, dr apart, or kGroupRows or
// kGroupPairRows adjacent rows from a multiple of kGroupRows) against `count` (<= token_step<NR>())
// activation rows: o[i][j] = dot(row r + i * dr, activation j). A group (or pair of groups) goes
// through the table's group kernel where the weight has a grouped copy (`grouped`,
// weight_copies.h); otherwise a group goes through the table's prepared tile where the
// activations were prepared for it, else its tile kernel of that size where there is one, else one
// multi-dot per row; all are bit-identical to vec_dot, so the grouping never changes results.
struct RowDots {
  const WeightView& w;
  VecDotMultiFn multi;
  VecDotTileFn tile, tile4;
  const PreparedTile& prepared;
  const RowGroups& groups;
  const uint8_t* grouped;
  RowDots(const KernelTable& k, const WeightView& wv, const uint8_t* grouped_copy = nullptr)
      : w(wv),
        multi(k.vec_dot_multi[static_cast<uint32_t>(wv.type)]),
        tile(k.tile[static_cast<uint32_t>(wv.type)]),
        tile4(k.tile4[static_cast<uint32_t>(wv.type)]),
        prepared(k.prepared[static_cast<uint32_t>(wv.type)]),
        groups(k.groups[static_cast<uint32_t>(wv.type)]),
        grouped(grouped_copy) {}
  const uint8_t* row(int64_t r) const { return w.data + static_cast<uint64_t>(r) * w.row_bytes; }
  // Activation rows per rows<NR>() call: a group kernel on tiles takes up to kGroupTokens.
  template <int NR>
  int token_step() const {
    return (NR == kGroupRows || NR == kGroupPairRows) && grouped ? groups.max_count : kMultiDot;
  }
  template <int NR>
  void rows(int64_t r, int64_t dr, const ActRows& a, int count, float (*o)[kGroupTokens]) const {
    if constexpr (NR == kGroupPairRows) {
      if (grouped) {
        const size_t bytes = groups.group_bytes(w.cols);
        groups.dot_pair(w.cols, o[0], kGroupTokens, grouped + static_cast<size_t>(r / kGroupRows) * bytes, bytes,
                        a.data, a.stride, count);
        return;
      }
    }
    if constexpr (NR == kGroupRows) {
      if (grouped) {
        groups.dot(w.cols, o[0], kGroupTokens, grouped + static_cast<size_t>(r / kGroupRows) * groups.group_bytes(w.cols),
                   0, a.data, a.stride, count);
        return;
      }
    }
    const size_t w_stride = static_cast<size_t>(dr) * w.row_bytes;
    if (a.prepared && NR == prepared.rows) {
      prepared.tile(w.cols, o[0], kGroupTokens, row(r), w_stride, a.prepared, a.prepared_stride, count);
      return;
    }
    if constexpr (NR == kTileRows) {
      if (tile) {
        tile(w.cols, o[0], kGroupTokens, row(r), w_stride, a.data, a.stride, count);
        return;
      }
    }
    if constexpr (NR == kQuadRows) {
      if (tile4) {
        tile4(w.cols, o[0], kGroupTokens, row(r), w_stride, a.data, a.stride, count);
        return;
      }
    }
    for (int i = 0; i < NR; ++i) multi(w.cols, o[i], row(r + i * dr), a.data, a.stride, count);
  }
};

// Calls body(std::integral_constant<int, NR>(), r, dr) for the rows [r0, r1) of a task: NR = 1
// per row, or (step kTileRows = 2 / kQuadRows = 4) groups of rows a part of the task apart:
// r0 + i, r0 + h + i, ... (h = the task's rows / step), plus lone last rows when the count is not
// a multiple of the step. Groups of distant rows are `step` sequential streams through the
// weights; groups of adjacent rows interleave streams one row apart, which the AMD Zen 4 hardware
// prefetcher follows badly (one thread streaming a 136 MB Q8_0 matrix from DRAM through the 2-row
// tile: 8.9 GB/s with adjacent rows, 23-28 GB/s with distant ones, 23-27 GB/s one row at a time).
// The row count NR is a compile-time constant in the body, so the single-row path of tables
// without tiles is the plain loop.
template <int NR, class Body>
inline int64_t for_row_groups(int64_t r0, int64_t r1, Body& body) {
  const int64_t h = (r1 - r0) / NR;
  for (int64_t i = 0; i < h; ++i) body(std::integral_constant<int, NR>(), r0 + i, h);
  return r0 + NR * h;
}
// Step kGroupRows: groups of adjacent rows r, r + 1, ... from r0 (a multiple of kGroupRows), the
// rows of one group of a grouped copy; step kGroupPairRows: two such groups at a time, then one.
template <class Body>
inline void for_rows(int64_t r0, int64_t r1, int step, Body&& body) {
  int64_t r = r0;
  if (step == kTileRows) r = for_row_groups<kTileRows>(r0, r1, body);
  if (step == kQuadRows) r = for_row_groups<kQuadRows>(r0, r1, body);
  if (step == kGroupPairRows)
    for (; r + kGroupPairRows <= r1; r += kGroupPairRows)
      body(std::integral_constant<int, kGroupPairRows>(), r, int64_t{1});
  if (step == kGroupRows || step == kGroupPairRows)
    for (; r + kGroupRows <= r1; r += kGroupRows) body(std::integral_constant<int, kGroupRows>(), r, int64_t{1});
  for (; r < r1; ++r) body(std::integral_constant<int, 1>(), r, int64_t{0});
}

// Weight rows stream from DRAM once per token in decode. Each task can also ask for the rows it
// will need `g_prefetch_rows` rows ahead (software prefetch, non-temporal), for hardware
// prefetchers that lose the stream at every 4 KiB page of a file mapping. Every x86 measured streams
// faster without it: AMD Zen 4 (one thread streaming Q8_0 rows: 23-27 GB/s without, 20-22 GB/s
// with whole rows 2 ahead; decode of the OLMoE-shaped model 41 vs 35 tok/s), an Intel Xeon with
// AMX (2 threads: 19.4-20.2 tok/s without, 11.6-13.9 with 2 rows) and an AMD Zen 3 (Q4_K rows:
// 26.0-28.5 without, 22.4-23.6 with 2). So x86 defaults to 0; other CPUs keep 2 (unmeasured on
// hardware). MOELITE_PREFETCH_ROWS overrides.
// (Not the same thing as the avx2 table's in-kernel prefetch of a few hundred bytes ahead into L1,
// which did pay on that Zen 3: simd/x86_q45k_groups.h.)
int g_prefetch_rows = [] {
  int64_t v;
  if (option_int(Option::PrefetchRows, &v)) return static_cast<int>(v);
#if defined(__x86_64__) || defined(__i386__)
  return 0;
#else
  return 2;
#endif
}();

inline void prefetch_row(const uint8_t* p, uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 0);
}
// At row r of a task ending at r1, rows dr apart (see for_rows): the nr rows `g_prefetch_rows`
// ahead of r, r + dr, ... (a prefetch past the task or the matrix never faults).
inline void prefetch_ahead(const WeightView& w, int64_t r, int64_t dr, int64_t r1, int nr) {
  if (g_prefetch_rows <= 0) return;
  for (int i = 0; i < nr; ++i) {
    const int64_t p = r + i * dr + g_prefetch_rows;
    if (p < r1) prefetch_row(w.data + static_cast<uint64_t>(p) * w.row_bytes, w.row_bytes);
  }
}

// Scratch growth that reports a failed allocation instead of throwing.
template <typename T>
Status grow(std::vector<T>* v, size_t n) {
  if (v->size() >= n) return MOELITE_OK;
  try {
    v->resize(n);
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "CPU backend scratch of %zu elements", n);
  }
  return MOELITE_OK;
}

// Whether a batch whose row groups are `step` rows takes the prepared tile of `type`.
bool use_prepared(const KernelTable& k, TensorType type, int step) {
  const PreparedTile& p = k.prepared[static_cast<uint32_t>(type)];
  return p.tile && p.rows == step;
}

// The matrix tile of one weight matrix: o[i * kMatrixTokens + j] = dot(row r + i, token j) for
// i < nr and j < count: the full groups of kMatrixRows rows in one call of the tile (it sets the
// tiles up once per call), the rows after them through multi-dots (the same bits), from tokens
// packed by the tile's pack (`packed`) and the same tokens' rows (`act`, `stride` apart).
struct MatrixDots {
  const WeightView& w;
  const MatrixTile& m;
  VecDotMultiFn multi;
  MatrixDots(const KernelTable& k, const WeightView& wv)
      : w(wv), m(k.matrix[static_cast<uint32_t>(wv.type)]), multi(k.vec_dot_multi[static_cast<uint32_t>(wv.type)]) {}
  const uint8_t* row(int64_t r) const { return w.data + static_cast<uint64_t>(r) * w.row_bytes; }
  // Whether a chunk of `count` tokens goes through the tile (else the multi-dots, unpacked).
  bool tiles(int count) const { return count >= matrix_min_tokens(m); }
  void rows(int64_t r, int64_t nr, const uint8_t* packed, const uint8_t* act, size_t stride, int count, float* o) const {
    const int64_t groups = tiles(count) ? nr / kMatrixRows : 0;
    if (groups > 0) m.dot(w.cols, o, kMatrixTokens, row(r), w.row_bytes, packed, groups, count);
    for (int64_t i = groups * kMatrixRows; i < nr; ++i)
      for (int j = 0; j < count; j += kMultiDot)
        multi(w.cols, o + i * kMatrixTokens + j, row(r + i), act + static_cast<size_t>(j) * stride, stride,
              std::min(kMultiDot, count - j));
  }
};

// Rows [r0, r1) of a matrix against n_tok activation rows through its matrix tile: tokens in
// chunks of kMatrixTokens, each packed once into the calling thread's scratch, then all the rows
// against them. emit(row, token, value) for every output.
template <class Emit>
void matrix_task(const MatrixDots& dots, int64_t r0, int64_t r1, const uint8_t* act, size_t stride, int64_t n_tok,
                 MatrixScratch& scratch, Emit&& emit) {
  for (int64_t t = 0; t < n_tok; t += kMatrixTokens) {
    const int count = static_cast<int>(std::min<int64_t>(kMatrixTokens, n_tok - t));
    const uint8_t* a = act + static_cast<size_t>(t) * stride;
    if (dots.tiles(count)) dots.m.pack(a, stride, count, dots.w.cols, scratch.pack[0].data());
    float* o = scratch.out[0].data();
    dots.rows(r0, r1 - r0, scratch.pack[0].data(), a, stride, count, o);
    for (int64_t i = 0; i < r1 - r0; ++i)
      for (int j = 0; j < count; ++j) emit(r0 + i, t + j, o[i * kMatrixTokens + j]);
  }
}

// Tokens per task in batched products: the activations of one chunk stay in L2 while each weight
// row is reused from L1 across them.
constexpr int64_t kTokenChunk = 32;

// The most activation rows any job of a call has (1: a decode step).
template <typename Job>
int64_t max_rows_of(const std::vector<Job>& jobs) {
  int64_t most = 0;
  for (const Job& j : jobs) most = std::max(most, j.n_rows);
  return most;
}

// A chunk of one job's output rows: the unit of work the pool schedules.
struct Task {
  int32_t job;
  int64_t r0, r1;
};

template <typename Job, typename RowsOf>
std::vector<Task> split_rows(const std::vector<Job>& jobs, RowsOf rows_of_job, int threads, int step) {
  // One chunk size for the whole call, from all its rows: several experts of a call already
  // spread over the threads, so each can stay one long task.
  int64_t total = 0;
  for (const Job& j : jobs) total += rows_of_job(j);
  const int64_t rc = row_chunk(total, threads, step);
  std::vector<Task> tasks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t rows = rows_of_job(jobs[j]);
    for (int64_t r0 = 0; r0 < rows; r0 += rc) tasks.push_back({static_cast<int32_t>(j), r0, std::min(rows, r0 + rc)});
  }
  return tasks;
}

int64_t max_task_rows(const std::vector<Task>& tasks) {
  int64_t most = 0;
  for (const Task& t : tasks) most = std::max(most, t.r1 - t.r0);
  return most;
}

}  // namespace

CpuBackend::CpuBackend(std::unique_ptr<ThreadPool> pool, std::shared_ptr<WeightCopies> copies)
    : k_(kernels_best()),
      pool_(std::move(pool)),
      copies_(std::move(copies)),
      name_(std::string("cpu (") + kernels_best().isa + ")") {
  attn_scores_.resize(static_cast<size_t>(pool_->size()));
}

Status CpuBackend::create(int32_t n_threads, std::unique_ptr<Backend>* out) {
  std::shared_ptr<WeightCopies> copies;
  try {
    copies = std::make_shared<WeightCopies>();
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "CPU backend");
  }
  return create_sharing(n_threads, std::move(copies), out);
}

Status CpuBackend::create_sharing(int32_t n_threads, std::shared_ptr<WeightCopies> copies,
                                  std::unique_ptr<Backend>* out) {
  std::unique_ptr<ThreadPool> pool;
  // On big.LITTLE CPUs the workers stay on the big cores (empty on homogeneous CPUs: unpinned).
  // Asked for more threads than there are big cores, the caller wants the little ones too: no pin.
  const std::vector<int>& big = platform::big_cores();
  MOELITE_TRY(ThreadPool::create(n_threads, &pool, n_threads <= static_cast<int32_t>(big.size()) ? big : std::vector<int>{}));
  // A failed allocation throws here, as everywhere in load, and the C API's guard reports it.
  out->reset(new CpuBackend(std::move(pool), std::move(copies)));
  return MOELITE_OK;
}

Status CpuBackend::place_expert(const ExpertWeights& w) {
  for (const WeightView* v : {&w.gate, &w.up, &w.down}) copies_->get_or_make(k_, *v, pool_.get());
  return MOELITE_OK;
}

CpuBackend::~CpuBackend() = default;

Status CpuBackend::place_weight(const WeightView& w) {
  if (!w.data) return fail(MOELITE_ERR_INTERNAL, "CPU backend got a weight without host bytes");
  return check_weight(w);
}

Status CpuBackend::check_weight(const WeightView& w) {
  if (!k_.vec_dot[static_cast<uint32_t>(w.type)])
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "no CPU kernel for weight type %s", type_name(w.type));
  return MOELITE_OK;
}

Status CpuBackend::alloc_act(int64_t rows, int64_t cols, Act* out) {
  if (rows <= 0 || cols <= 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "empty activation");
  void* p = platform::aligned_alloc_bytes(static_cast<size_t>(rows * cols) * sizeof(float), 64);
  if (!p) return fail(MOELITE_ERR_OUT_OF_MEMORY, "activation of %lld x %lld floats", (long long)rows, (long long)cols);
  memset(p, 0, static_cast<size_t>(rows * cols) * sizeof(float));
  out->handle = p;
  out->rows = rows;
  out->cols = cols;
  return MOELITE_OK;
}

void CpuBackend::free_act(Act* a) {
  platform::aligned_free(a->handle);
  *a = Act{};
}

Act CpuBackend::view_rows(const Act& a, int64_t row0, int64_t n) { return Act{rows_of(a) + row0 * a.cols, n, a.cols}; }

Status CpuBackend::read_rows(const Act& a, int64_t row0, int64_t n, float* dst) {
  memcpy(dst, rows_of(a) + row0 * a.cols, static_cast<size_t>(n * a.cols) * sizeof(float));
  return MOELITE_OK;
}

Status CpuBackend::alloc_kv(int32_t n_ctx, const std::vector<int32_t>& slots, int64_t kv_dim, bool values,
                            KvCache* out) {
  KvCache made = kv_cache_shape(n_ctx, slots, kv_dim, values);  // may throw; nothing is allocated yet
  std::unique_ptr<KvStorage> s(new (std::nothrow) KvStorage);
  if (!s) return fail(MOELITE_ERR_OUT_OF_MEMORY, "KV cache");
  // Room for every pointer first: a push_back that threw after its allocation would leak it.
  s->k.reserve(slots.size());
  s->v.reserve(slots.size());
  for (const int32_t n : slots) {
    const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(kv_dim) * sizeof(float);
    for (std::vector<float*>* side : {&s->k, &s->v}) {
      if (side == &s->v && !values) continue;
      side->push_back(static_cast<float*>(platform::aligned_alloc_bytes(bytes, 64)));
      if (!side->back()) return fail(MOELITE_ERR_OUT_OF_MEMORY, "KV cache layer of %zu bytes", bytes);
    }
  }
  made.handle = s.release();
  *out = std::move(made);
  return MOELITE_OK;
}

void CpuBackend::free_kv(KvCache* kv) {
  delete static_cast<KvStorage*>(kv->handle);
  *kv = KvCache{};
}

Status CpuBackend::read_kv(const KvCache& kv, int32_t layer, int32_t slot0, int32_t n, float* keys, float* values) {
  MOELITE_TRY(kv_check_slots(kv, layer, slot0, n));
  const auto* s = static_cast<const KvStorage*>(kv.handle);
  const size_t off = static_cast<size_t>(slot0) * static_cast<size_t>(kv.kv_dim);
  const size_t count = static_cast<size_t>(n) * static_cast<size_t>(kv.kv_dim);
  std::copy_n(s->k[static_cast<size_t>(layer)] + off, count, keys);
  if (kv.values) std::copy_n(s->v[static_cast<size_t>(layer)] + off, count, values);
  return MOELITE_OK;
}

Status CpuBackend::write_kv(KvCache* kv, int32_t layer, int32_t slot0, int32_t n, const float* keys,
                            const float* values) {
  MOELITE_TRY(kv_check_slots(*kv, layer, slot0, n));
  auto* s = static_cast<KvStorage*>(kv->handle);
  const size_t off = static_cast<size_t>(slot0) * static_cast<size_t>(kv->kv_dim);
  const size_t count = static_cast<size_t>(n) * static_cast<size_t>(kv->kv_dim);
  std::copy_n(keys, count, s->k[static_cast<size_t>(layer)] + off);
  if (kv->values) std::copy_n(values, count, s->v[static_cast<size_t>(layer)] + off);
  return MOELITE_OK;
}

Status CpuBackend::get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) {
  DequantRowFn dequant = k_.dequant[static_cast<uint32_t>(table.type)];
  // A table tied to the output head has the head's row copy, if any: its mapped pages were released.
  WeightView rows = table;
  const uint8_t* grouped = nullptr;  // a grouped copy is not row-addressable: the mapping is read then
  compute_on(copies_->find(table), &rows, &grouped);
  for (int32_t t = 0; t < n; ++t)
    dequant(rows.data + static_cast<uint64_t>(tokens[t]) * rows.row_bytes, rows_of(*out) + t * out->cols, rows.cols);
  return MOELITE_OK;
}

Status CpuBackend::rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) {
  const int64_t groups_per_row = x.cols / group;
  const int64_t total = x.rows * groups_per_row;
  const float* src = rows_of(x);
  float* dst = rows_of(*out);
  auto body = [&](int64_t g, int) { rms_norm_row(src + g * group, w, group, eps, dst + g * group); };
  if (total * group < 16384) {
    for (int64_t g = 0; g < total; ++g) body(g, 0);
  } else {
    pool_->parallel_for(total, body);
  }
  return MOELITE_OK;
}

Status CpuBackend::quantize_rows(const float* x, int64_t rows, int64_t cols, TensorType weight_type,
                                 std::vector<uint8_t>* buf, const uint8_t** out) {
  const TensorType dt = dot_type(weight_type);
  if (dt == TensorType::F32) {
    *out = reinterpret_cast<const uint8_t*>(x);
    return MOELITE_OK;
  }
  const size_t row_bytes = activation_row_bytes(weight_type, cols);
  MOELITE_TRY(grow(buf, row_bytes * static_cast<size_t>(rows)));
  QuantizeRowFn quantize = k_.quantize_act[static_cast<uint32_t>(dt)];
  uint8_t* dst = buf->data();
  auto body = [&](int64_t r, int) { quantize(x + r * cols, dst + r * row_bytes, cols); };
  if (rows < 4) {
    for (int64_t r = 0; r < rows; ++r) body(r, 0);
  } else {
    pool_->parallel_for(rows, body);
  }
  *out = dst;
  return MOELITE_OK;
}

Status CpuBackend::grow_matrix_scratch(int sides, TensorType weight_type, int64_t cols, int64_t task_rows) {
  const size_t pack_bytes = k_.matrix[static_cast<uint32_t>(weight_type)].packed_bytes(cols);
  const size_t out_floats = static_cast<size_t>(task_rows) * kMatrixTokens;
  try {
    matrix_scratch_.resize(static_cast<size_t>(pool_->size()));
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "CPU backend matrix scratch");
  }
  for (MatrixScratch& m : matrix_scratch_)
    for (int i = 0; i < sides; ++i) {
      MOELITE_TRY(grow(&m.pack[i], pack_bytes));
      MOELITE_TRY(grow(&m.out[i], out_floats));
    }
  return MOELITE_OK;
}

Status CpuBackend::prepare_rows(TensorType weight_type, int step, const uint8_t* act, size_t stride, int64_t rows,
                                int64_t cols, std::vector<uint8_t>* buf, ActRows* out, const int64_t* row_cols) {
  *out = ActRows{act, stride};
  if (!use_prepared(k_, weight_type, step)) return MOELITE_OK;
  const PreparedTile& p = k_.prepared[static_cast<uint32_t>(weight_type)];
  const size_t pstride = p.prepared_bytes(cols);
  MOELITE_TRY(grow(buf, pstride * static_cast<size_t>(rows)));
  uint8_t* dst = buf->data();
  // Row r holds row_cols[r] <= cols elements where given (jobs of different n_ff in one call): the
  // prepared layout depends on the length, so each row is prepared at the length it is used with.
  auto body = [&](int64_t r, int) {
    p.prepare(act + static_cast<size_t>(r) * stride, row_cols ? row_cols[r] : cols, dst + static_cast<size_t>(r) * pstride);
  };
  if (rows < 16) {
    for (int64_t r = 0; r < rows; ++r) body(r, 0);
  } else {
    pool_->parallel_for(rows, body);
  }
  out->prepared = dst;
  out->prepared_stride = pstride;
  return MOELITE_OK;
}

Status CpuBackend::matmul_rows(const WeightView& w, const uint8_t* grouped, const uint8_t* act, size_t act_stride,
                               int64_t n, float* out, int64_t out_stride) {
  if (use_matrix(k_, w.type, n, grouped != nullptr)) {
    // Row chunks only: each task packs its tokens kMatrixTokens at a time and runs its rows by them.
    const MatrixDots dots(k_, w);
    const int64_t rc = row_chunk(w.rows, pool_->size(), kMatrixRows);
    MOELITE_TRY(grow_matrix_scratch(1, w.type, w.cols, rc));
    pool_->parallel_for((w.rows + rc - 1) / rc, [&](int64_t task, int thread) {
      const int64_t r0 = task * rc, r1 = std::min(w.rows, r0 + rc);
      matrix_task(dots, r0, r1, act, act_stride, n, matrix_scratch_[static_cast<size_t>(thread)],
                  [&](int64_t r, int64_t t, float v) { out[t * out_stride + r] = v; });
    });
    return MOELITE_OK;
  }
  const RowDots dots(k_, w, grouped);
  const int step = row_step(k_, w.type, n);
  ActRows a;
  MOELITE_TRY(prepare_rows(w.type, step, act, act_stride, n, w.cols, &prep_a_, &a));
  const int64_t rc = row_chunk(w.rows, pool_->size(), step);
  const int64_t n_rc = (w.rows + rc - 1) / rc;
  const int64_t n_tc = (n + kTokenChunk - 1) / kTokenChunk;
  pool_->parallel_for(n_rc * n_tc, [&](int64_t task, int) {
    const int64_t r0 = (task % n_rc) * rc, r1 = std::min(w.rows, r0 + rc);
    const int64_t t0 = (task / n_rc) * kTokenChunk, t1 = std::min(n, t0 + kTokenChunk);
    for_rows(r0, r1, step, [&](auto nr_c, int64_t r, int64_t dr) {
      constexpr int NR = decltype(nr_c)::value;
      prefetch_ahead(w, r, dr, r1, NR);
      // kMultiDot tokens per call (a group kernel on tiles: up to kGroupTokens) decode the weight
      // row(s) once per group; the result of each token is bit-identical to a single vec_dot, so
      // batching never changes the output.
      const int step_t = dots.token_step<NR>();
      for (int64_t t = t0; t < t1; t += step_t) {
        const int count = static_cast<int>(std::min<int64_t>(step_t, t1 - t));
        float o[NR][kGroupTokens];
        dots.rows<NR>(r, dr, a.at(t), count, o);
        for (int i = 0; i < NR; ++i)
          for (int j = 0; j < count; ++j) out[(t + j) * out_stride + r + i * dr] = o[i][j];
      }
    });
  });
  return MOELITE_OK;
}

Status CpuBackend::matmul(const WeightView& w, const Act& x, const float* bias, Act* out) {
  const uint8_t* act;
  MOELITE_TRY(quantize_rows(rows_of(x), x.rows, x.cols, w.type, &qbuf_, &act));
  const size_t stride = activation_row_bytes(w.type, x.cols);  // 4 * cols for float activations
  float* y = rows_of(*out);
  WeightView wc = w;
  const uint8_t* grouped = nullptr;
  compute_on(copies_->get_or_make(k_, w, pool_.get()), &wc, &grouped);
  MOELITE_TRY(matmul_rows(wc, grouped, act, stride, x.rows, y, out->cols));
  if (bias) {
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t r = 0; r < w.rows; ++r) y[t * out->cols + r] += bias[r];
  }
  return MOELITE_OK;
}

Status CpuBackend::add(Act* x, const Act& y) {
  float* a = rows_of(*x);
  const float* b = rows_of(y);
  const int64_t n = x->rows * x->cols;
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  return MOELITE_OK;
}

Status CpuBackend::scale(Act* x, float s) {
  float* a = rows_of(*x);
  const int64_t n = x->rows * x->cols;
  for (int64_t i = 0; i < n; ++i) a[i] *= s;
  return MOELITE_OK;
}

Status CpuBackend::add_bias(Act* x, const float* bias) {
  float* a = rows_of(*x);
  for (int64_t t = 0; t < x->rows; ++t)
    for (int64_t c = 0; c < x->cols; ++c) a[t * x->cols + c] += bias[c];
  return MOELITE_OK;
}

Status CpuBackend::rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) {
  const int64_t heads = x->cols / head_dim;
  float* data = rows_of(*x);
  std::vector<float> cos_v(static_cast<size_t>(p.n_rot / 2)), sin_v(cos_v.size());
  for (int64_t t = 0; t < x->rows; ++t) {
    rope_angles(p, positions[t], cos_v.data(), sin_v.data());  // once per token, shared by its heads
    for (int64_t h = 0; h < heads; ++h) rope_apply(data + t * x->cols + h * head_dim, p, cos_v.data(), sin_v.data());
  }
  return MOELITE_OK;
}

Status CpuBackend::copy_columns(const Act& x, int64_t x_stride, int64_t x_offset, int32_t n_groups, int64_t width,
                                Act* out, int64_t out_stride, int64_t out_offset) {
  MOELITE_TRY(check_copy_columns(x, x_stride, x_offset, n_groups, width, *out, out_stride, out_offset));
  const float* src = rows_of(x);
  float* dst = rows_of(*out);
  for (int64_t t = 0; t < x.rows; ++t)
    for (int32_t g = 0; g < n_groups; ++g)
      memcpy(dst + t * out->cols + g * out_stride + out_offset, src + t * x.cols + g * x_stride + x_offset,
             static_cast<size_t>(width) * sizeof(float));
  return MOELITE_OK;
}

Status CpuBackend::attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0,
                             int32_t n_head, int32_t n_head_kv, int64_t head_dim, const AttentionSpec& spec,
                             Act* out) {
  const int64_t n = q.rows;
  MOELITE_TRY(kv_check_batch(*kv, layer, pos0, n, spec));
  int64_t head_dim_v = 0;
  MOELITE_TRY(kv_value_width(*kv, spec, head_dim, &head_dim_v));
  auto* s = static_cast<KvStorage*>(kv->handle);
  const int64_t kv_dim = kv->kv_dim;
  const int32_t slots = kv->slots[static_cast<size_t>(layer)];
  float* k_layer = s->k[static_cast<size_t>(layer)];
  float* v_layer = kv->values ? s->v[static_cast<size_t>(layer)] : k_layer;  // keys-only: values lead each key
  for (int64_t t = 0; t < n; ++t) {  // row by row: a window's ring wraps
    const int64_t slot = kv_slot(pos0 + t, slots);
    memcpy(k_layer + slot * kv_dim, rows_of(k) + t * kv_dim, static_cast<size_t>(kv_dim) * sizeof(float));
    if (kv->values)
      memcpy(v_layer + slot * kv_dim, rows_of(v) + t * kv_dim, static_cast<size_t>(kv_dim) * sizeof(float));
  }
  for (auto& sc : attn_scores_) MOELITE_TRY(grow(&sc, static_cast<size_t>(slots)));
  const int32_t group = n_head / n_head_kv;
  const float scale = spec.scale > 0.0f ? spec.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const float* qd = rows_of(q);
  float* od = rows_of(*out);
  pool_->parallel_for(n * n_head, [&](int64_t task, int thread) {
    const int64_t t = task / n_head, h = task % n_head;
    const int32_t pos = pos0 + static_cast<int32_t>(t);
    AttendRange range{kv_first_visible(pos, spec.window), pos + 1, slots};
    attend_head(qd + t * q.cols + h * head_dim, k_layer, v_layer, kv_dim, (h / group) * head_dim, head_dim,
                head_dim_v, range, scale, spec.sinks ? spec.sinks[h] : -INFINITY, attn_scores_[thread].data(),
                od + t * out->cols + h * head_dim_v, k_.vec_dot[static_cast<uint32_t>(TensorType::F32)]);
  });
  return MOELITE_OK;
}

Status CpuBackend::route(const Act& logits, int32_t k, bool renormalize, Routing* r) {
  const int64_t n = logits.rows, n_expert = logits.cols;
  r->n_tokens = static_cast<int32_t>(n);
  r->k = k;
  r->ids.resize(static_cast<size_t>(n * k));
  r->weights.resize(static_cast<size_t>(n * k));
  std::vector<float> probs(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n; ++t) {
    memcpy(probs.data(), rows_of(logits) + t * n_expert, static_cast<size_t>(n_expert) * sizeof(float));
    softmax_row(probs.data(), n_expert);
    int32_t* ids = r->ids.data() + t * k;
    float* w = r->weights.data() + t * k;
    top_k(probs.data(), static_cast<int32_t>(n_expert), k, ids, w);
    if (renormalize) {
      float sum = 0.0f;
      for (int32_t j = 0; j < k; ++j) sum += w[j];
      for (int32_t j = 0; j < k; ++j) w[j] /= sum;
    }
  }
  return MOELITE_OK;
}

std::vector<CpuBackend::FfnJob> CpuBackend::jobs_of(const ExpertTask* tasks, int32_t n) const {
  std::vector<FfnJob> jobs(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    FfnJob& j = jobs[static_cast<size_t>(i)];
    j = {tasks[i].w, tasks[i].x_rows, tasks[i].out_rows, tasks[i].n_rows};
    // Copies of resident experts were made at load (place_expert); a slot has none.
    if (tasks[i].resident)
      for (int m = 0; m < 3; ++m) compute_on(copies_->find(tasks[i].w.matrix(m)), &j.w.matrix(m), &j.grouped[m]);
  }
  return jobs;
}

Status CpuBackend::quantized_input(const Act& x, TensorType weight_type, QuantizedInput* cache, const uint8_t** out) {
  const TensorType dt = dot_type(weight_type);
  QuantizedInput& p = *cache;
  for (int i = 0; i < 2; ++i)
    if (p.x_quant[i] && p.x_format[i] == dt) {
      *out = p.x_quant[i];
      return MOELITE_OK;
    }
  const int slot = p.x_quant[0] ? 1 : 0;
  MOELITE_TRY(quantize_rows(rows_of(x), x.rows, x.cols, weight_type, &p.x_buf[slot], &p.x_quant[slot]));
  p.x_format[slot] = dt;
  *out = p.x_quant[slot];
  return MOELITE_OK;
}

// All jobs of one call share weight types (the model loader checks that every expert of a layer
// has the gate/up/down types of the first), so activations are quantized once per format.
Status CpuBackend::ffn_gate_up(const std::vector<FfnJob>& jobs, const Act& x, const FfnKind& kind,
                               QuantizedInput* input) {
  h_rows_ = 0;
  if (jobs.empty()) return MOELITE_OK;
  const int64_t n_embd = x.cols;
  // Activations in the dot formats of the gate/up weights (usually one format for all).
  const TensorType gate_type = jobs[0].w.gate.type, up_type = jobs[0].w.up.type;
  const uint8_t *xq_gate, *xq_up;
  MOELITE_TRY(quantized_input(x, gate_type, input, &xq_gate));
  MOELITE_TRY(quantized_input(x, up_type, input, &xq_up));
  const size_t gate_stride = activation_row_bytes(gate_type, n_embd), up_stride = activation_row_bytes(up_type, n_embd);

  // h rows: one per (job, routed row), n_ff_max floats each.
  n_ff_max_ = 0;
  h_offset_.assign(jobs.size(), 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    n_ff_max_ = std::max(n_ff_max_, jobs[j].w.gate.rows);
    h_offset_[j] = h_rows_;
    h_rows_ += jobs[j].n_rows;
  }
  MOELITE_TRY(grow(&ffn_h_, static_cast<size_t>(h_rows_ * n_ff_max_)));
  float* h = ffn_h_.data();
  const int64_t n_ff_max = n_ff_max_;
  const int64_t h_rows = h_rows_;

  // The multi-row dot kernels take evenly strided activation rows, but a job's tokens are
  // scattered through x. Copy them so row h_offset[j] + i holds token x_rows[i] of job j (the
  // same row numbering as h), in each dot format.
  auto gather = [&](const uint8_t* src, size_t stride, std::vector<uint8_t>* buf, const uint8_t** out) -> Status {
    MOELITE_TRY(grow(buf, stride * static_cast<size_t>(h_rows)));
    uint8_t* dst = buf->data();
    for (size_t j = 0; j < jobs.size(); ++j)
      for (int64_t i = 0; i < jobs[j].n_rows; ++i)
        memcpy(dst + static_cast<size_t>(h_offset_[j] + i) * stride,
               src + static_cast<size_t>(jobs[j].x_rows[i]) * stride, stride);
    *out = dst;
    return MOELITE_OK;
  };
  const uint8_t *xg_gate, *xg_up;
  MOELITE_TRY(gather(xq_gate, gate_stride, &ffn_xg_gate_, &xg_gate));
  if (xq_up == xq_gate && up_stride == gate_stride)
    xg_up = xg_gate;
  else
    MOELITE_TRY(gather(xq_up, up_stride, &ffn_xg_up_, &xg_up));

  // h = act(gate x, up x) for every routed row of every job.
  const int64_t max_tokens = max_rows_of(jobs);
  // The matrix tile where both projections have one (else the row kernels for both).
  bool grouped = false;
  for (const FfnJob& j : jobs) grouped = grouped || j.grouped[0] || j.grouped[1];
  const bool matrix =
      use_matrix(k_, gate_type, max_tokens, grouped) && use_matrix(k_, up_type, max_tokens, grouped);
  if (matrix) {
    const bool same_pack = xg_up == xg_gate && k_.matrix[static_cast<uint32_t>(gate_type)].pack ==
                                                   k_.matrix[static_cast<uint32_t>(up_type)].pack;
    const std::vector<Task> tasks = split_rows(
        jobs, [](const FfnJob& j) { return j.w.gate.rows; }, pool_->size(), kMatrixRows);
    MOELITE_TRY(grow_matrix_scratch(2, gate_type, n_embd, max_task_rows(tasks)));
    MOELITE_TRY(grow_matrix_scratch(2, up_type, n_embd, max_task_rows(tasks)));  // grows only if larger
    pool_->parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti, int thread) {
      const Task& task = tasks[static_cast<size_t>(ti)];
      const FfnJob& job = jobs[static_cast<size_t>(task.job)];
      const MatrixDots gdots(k_, job.w.gate), udots(k_, job.w.up);
      const int64_t base = h_offset_[static_cast<size_t>(task.job)];
      float* hj = h + base * n_ff_max;
      MatrixScratch& scratch = matrix_scratch_[static_cast<size_t>(thread)];
      uint8_t* pg = scratch.pack[0].data();
      uint8_t* pu = same_pack ? pg : scratch.pack[1].data();
      float* g = scratch.out[0].data();
      float* u = scratch.out[1].data();
      const int64_t nr = task.r1 - task.r0;
      const uint8_t* ag = xg_gate + static_cast<size_t>(base) * gate_stride;
      const uint8_t* au = xg_up + static_cast<size_t>(base) * up_stride;
      for (int64_t t = 0; t < job.n_rows; t += kMatrixTokens) {
        const int count = static_cast<int>(std::min<int64_t>(kMatrixTokens, job.n_rows - t));
        const uint8_t* agt = ag + static_cast<size_t>(t) * gate_stride;
        const uint8_t* aut = au + static_cast<size_t>(t) * up_stride;
        if (gdots.tiles(count)) gdots.m.pack(agt, gate_stride, count, n_embd, pg);
        if (!same_pack && udots.tiles(count)) udots.m.pack(aut, up_stride, count, n_embd, pu);
        gdots.rows(task.r0, nr, pg, agt, gate_stride, count, g);
        udots.rows(task.r0, nr, pu, aut, up_stride, count, u);
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t r = task.r0 + i;
          const float gb = job.w.gate_bias ? job.w.gate_bias[r] : 0.0f;
          const float ub = job.w.up_bias ? job.w.up_bias[r] : 0.0f;
          for (int j = 0; j < count; ++j) {
            float gv = g[i * kMatrixTokens + j], uv = u[i * kMatrixTokens + j];
            if (job.w.gate_bias || job.w.up_bias) gv += gb, uv += ub;
            hj[(t + j) * n_ff_max + r] = ffn_activation(kind, gv, uv);
          }
        }
      }
    });
    return MOELITE_OK;
  }
  // Rows in pairs where either projection has a tile kernel (dot_rows runs the other as
  // multi-dots); tasks then hold even row counts.
  const int step = std::max(row_step(k_, gate_type, max_tokens), row_step(k_, up_type, max_tokens));
  ActRows ag, au;
  MOELITE_TRY(prepare_rows(gate_type, step, xg_gate, gate_stride, h_rows, n_embd, &prep_a_, &ag));
  // Gate and up share prepared rows where they read the same activations through the same
  // prepare (one type, or two types of one dot format such as Q8_0 with Q4_0).
  const PreparedTile& pg = k_.prepared[static_cast<uint32_t>(gate_type)];
  const PreparedTile& pu = k_.prepared[static_cast<uint32_t>(up_type)];
  const bool same_prepare = pg.tile && pu.tile && pg.prepare == pu.prepare && pg.rows == pu.rows;
  if (xg_up == xg_gate && (up_type == gate_type || same_prepare))
    au = ActRows{xg_up, up_stride, ag.prepared, ag.prepared_stride};
  else
    MOELITE_TRY(prepare_rows(up_type, step, xg_up, up_stride, h_rows, n_embd, &prep_b_, &au));
  const std::vector<Task> tasks = split_rows(
      jobs, [](const FfnJob& j) { return j.w.gate.rows; }, pool_->size(), step);
  pool_->parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti, int) {
    const Task& task = tasks[static_cast<size_t>(ti)];
    const FfnJob& job = jobs[static_cast<size_t>(task.job)];
    const WeightView &gw = job.w.gate, &uw = job.w.up;
    const RowDots gdots(k_, gw, job.grouped[0]), udots(k_, uw, job.grouped[1]);
    const int64_t base = h_offset_[static_cast<size_t>(task.job)];
    float* hj = h + base * n_ff_max;
    for_rows(task.r0, task.r1, step, [&](auto nr_c, int64_t r, int64_t dr) {
      constexpr int NR = decltype(nr_c)::value;
      prefetch_ahead(gw, r, dr, task.r1, NR);
      prefetch_ahead(uw, r, dr, task.r1, NR);
      const int step_t = std::min(gdots.token_step<NR>(), udots.token_step<NR>());
      for (int64_t i = 0; i < job.n_rows; i += step_t) {
        const int count = static_cast<int>(std::min<int64_t>(step_t, job.n_rows - i));
        float g[NR][kGroupTokens], u[NR][kGroupTokens];
        gdots.rows<NR>(r, dr, ag.at(base + i), count, g);
        udots.rows<NR>(r, dr, au.at(base + i), count, u);
        for (int ri = 0; ri < NR; ++ri) {
          if (job.w.gate_bias || job.w.up_bias) {
            const float gb = job.w.gate_bias ? job.w.gate_bias[r + ri * dr] : 0.0f;
            const float ub = job.w.up_bias ? job.w.up_bias[r + ri * dr] : 0.0f;
            for (int j = 0; j < count; ++j) g[ri][j] += gb, u[ri][j] += ub;
          }
          for (int j = 0; j < count; ++j) hj[(i + j) * n_ff_max + r + ri * dr] = ffn_activation(kind, g[ri][j], u[ri][j]);
        }
      }
    });
  });
  return MOELITE_OK;
}

Status CpuBackend::ffn_down(const std::vector<FfnJob>& jobs, int64_t n_embd, float* results) {
  if (jobs.empty() || h_rows_ == 0) return MOELITE_OK;
  const float* h = ffn_h_.data();
  const int64_t n_ff_max = n_ff_max_, h_rows = h_rows_;
  // Quantize h for the down projections.
  const TensorType down_type = jobs[0].w.down.type;
  const size_t hq_stride = activation_row_bytes(down_type, n_ff_max);
  const uint8_t* hq = reinterpret_cast<const uint8_t*>(h);
  // Each h row's length (its job's n_ff), for quantizing and preparing it: only quantized down
  // weights read it, so float ones skip building it.
  const bool quantized = dot_type(down_type) != TensorType::F32;
  const int64_t* row_ff = nullptr;
  if (quantized) {
    MOELITE_TRY(grow(&row_ff_, static_cast<size_t>(h_rows)));
    for (size_t j = 0; j < jobs.size(); ++j)
      for (int64_t i = 0; i < jobs[j].n_rows; ++i) row_ff_[static_cast<size_t>(h_offset_[j] + i)] = jobs[j].w.gate.rows;
    row_ff = row_ff_.data();
    // Jobs with a shorter n_ff are quantized per job so each row is exactly that job's length.
    MOELITE_TRY(grow(&qbuf2_, hq_stride * static_cast<size_t>(h_rows)));
    QuantizeRowFn quantize = k_.quantize_act[static_cast<uint32_t>(dot_type(down_type))];
    uint8_t* dst = qbuf2_.data();
    auto body = [&](int64_t r, int) {
      quantize(h + r * n_ff_max, dst + static_cast<size_t>(r) * hq_stride, row_ff[r]);
    };
    // Decode quantizes top-k rows of n_ff (8 x 1024 floats: a few microseconds): not worth a
    // fork/join of the pool.
    if (h_rows * n_ff_max <= 16384) {
      for (int64_t r = 0; r < h_rows; ++r) body(r, 0);
    } else {
      pool_->parallel_for(h_rows, body);
    }
    hq = dst;
  }

  // results[out_row] = down h.
  bool grouped = false;
  for (const FfnJob& j : jobs) grouped = grouped || j.grouped[2];
  if (use_matrix(k_, down_type, max_rows_of(jobs), grouped)) {
    const std::vector<Task> tasks = split_rows(
        jobs, [](const FfnJob& j) { return j.w.down.rows; }, pool_->size(), kMatrixRows);
    MOELITE_TRY(grow_matrix_scratch(1, down_type, n_ff_max, max_task_rows(tasks)));
    pool_->parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti, int thread) {
      const Task& task = tasks[static_cast<size_t>(ti)];
      const FfnJob& job = jobs[static_cast<size_t>(task.job)];
      const MatrixDots ddots(k_, job.w.down);
      const int64_t base = h_offset_[static_cast<size_t>(task.job)];
      // The job's rows hold its own n_ff (the down matrix's cols) elements.
      matrix_task(ddots, task.r0, task.r1, hq + static_cast<size_t>(base) * hq_stride, hq_stride, job.n_rows,
                  matrix_scratch_[static_cast<size_t>(thread)], [&](int64_t r, int64_t t, float v) {
                    if (job.w.down_bias) v += job.w.down_bias[r];
                    results[static_cast<int64_t>(job.out_rows[t]) * n_embd + r] = v;
                  });
    });
    return MOELITE_OK;
  }
  const int step = row_step(k_, down_type, max_rows_of(jobs));
  ActRows ad;
  MOELITE_TRY(prepare_rows(down_type, step, hq, hq_stride, h_rows, n_ff_max, &prep_a_, &ad, row_ff));
  const std::vector<Task> tasks = split_rows(
      jobs, [](const FfnJob& j) { return j.w.down.rows; }, pool_->size(), step);
  pool_->parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti, int) {
    const Task& task = tasks[static_cast<size_t>(ti)];
    const FfnJob& job = jobs[static_cast<size_t>(task.job)];
    const WeightView& dw = job.w.down;
    const RowDots ddots(k_, dw, job.grouped[2]);
    const int64_t base = h_offset_[static_cast<size_t>(task.job)];
    for_rows(task.r0, task.r1, step, [&](auto nr_c, int64_t r, int64_t dr) {
      constexpr int NR = decltype(nr_c)::value;
      prefetch_ahead(dw, r, dr, task.r1, NR);
      const int step_t = ddots.token_step<NR>();
      for (int64_t i = 0; i < job.n_rows; i += step_t) {
        const int count = static_cast<int>(std::min<int64_t>(step_t, job.n_rows - i));
        float o[NR][kGroupTokens];
        ddots.rows<NR>(r, dr, ad.at(base + i), count, o);
        for (int ri = 0; ri < NR; ++ri) {
          if (job.w.down_bias)
            for (int j = 0; j < count; ++j) o[ri][j] += job.w.down_bias[r + ri * dr];
          for (int j = 0; j < count; ++j) results[static_cast<int64_t>(job.out_rows[i + j]) * n_embd + r + ri * dr] = o[ri][j];
        }
      }
    });
  });
  return MOELITE_OK;
}

Status CpuBackend::moe_begin(const Act& x, const FfnKind& kind, int64_t n_out_rows) {
  pass_.x = x;
  pass_.kind = kind;
  pass_.input.x_quant[0] = pass_.input.x_quant[1] = nullptr;
  return grow(&ffn_y_, static_cast<size_t>(n_out_rows * x.cols));
}

Status CpuBackend::expert_gate_up(const ExpertTask* tasks, int32_t n_tasks) {
  return ffn_gate_up(jobs_of(tasks, n_tasks), pass_.x, pass_.kind, &pass_.input);
}

Status CpuBackend::expert_down(const ExpertTask* tasks, int32_t n_tasks) {
  return ffn_down(jobs_of(tasks, n_tasks), pass_.x.cols, ffn_y_.data());
}

Status CpuBackend::moe_combine(const Routing& r, Act* out) {
  // Slot order, so the sum never depends on the order the experts ran in.
  const int32_t n = r.n_tokens, k = r.k;
  const int64_t n_embd = out->cols;
  float* o = rows_of(*out);
  const float* y = ffn_y_.data();
  for (int32_t t = 0; t < n; ++t) {
    float* ot = o + t * n_embd;
    for (int64_t c = 0; c < n_embd; ++c) ot[c] = 0.0f;
    for (int32_t j = 0; j < k; ++j) {
      if (r.ids[static_cast<size_t>(t * k + j)] < 0) continue;  // dropped by adaptive gating
      const float w = r.weights[static_cast<size_t>(t * k + j)];
      const float* yj = y + static_cast<int64_t>(t * k + j) * n_embd;
      for (int64_t c = 0; c < n_embd; ++c) ot[c] += w * yj[c];
    }
  }
  return MOELITE_OK;
}

Status CpuBackend::dense_ffn(const ExpertWeights& w, const FfnKind& kind, const float* gate_inp, const Act& x,
                             Act* out) {
  std::vector<int32_t> rows(static_cast<size_t>(x.rows));
  for (int32_t t = 0; t < x.rows; ++t) rows[static_cast<size_t>(t)] = t;
  std::vector<FfnJob> jobs{{w, rows.data(), rows.data(), x.rows}};
  // A dense FFN's weights stay put: copies on first use, like matmul's.
  for (int m = 0; m < 3; ++m)
    compute_on(copies_->get_or_make(k_, w.matrix(m), pool_.get()), &jobs[0].w.matrix(m), &jobs[0].grouped[m]);
  // Not part of a routed pass: x is quantized afresh into buffers of its own.
  dense_input_.x_quant[0] = dense_input_.x_quant[1] = nullptr;
  MOELITE_TRY(ffn_gate_up(jobs, x, kind, &dense_input_));
  float* o = rows_of(*out);
  MOELITE_TRY(ffn_down(jobs, out->cols, o));
  if (gate_inp) {
    const float* xd = rows_of(x);
    for (int64_t t = 0; t < x.rows; ++t) {
      double dot = 0.0;
      for (int64_t c = 0; c < x.cols; ++c) dot += static_cast<double>(gate_inp[c]) * xd[t * x.cols + c];
      const float g = sigmoid(static_cast<float>(dot));
      for (int64_t c = 0; c < out->cols; ++c) o[t * out->cols + c] *= g;
    }
  }
  return MOELITE_OK;
}

}  // namespace moelite::cpu
