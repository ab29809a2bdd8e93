// Micro-benchmark of the vec_dot kernels: one thread, a rows x cols weight matrix times one
// activation row (the decode matvec), reported as weight bytes streamed per second.
// Not part of the build; compile against the static library, e.g.
//   g++ -O2 -std=c++17 -I. tools/bench_kernels.cpp build/lib/libmoelite.a -lpthread
// Usage: bench_kernels [rows] [cols] [mode]   (mode 1: row pairs through the table's tile, if any;
//   mode 2: 4 activation rows per call, tile or multi-dot; mode 3: activations prepared once, then
//   the table's prepared tile, ACTS=n activation rows per weight row group, default 4; mode 4: rows
//   repacked in groups of eight where the table has a group kernel (interleaved_rows.h), ACTS=n
//   activation rows per call (default 1, at most the kernel's max_count), else "-"; mode 5: the table's matrix tile (AMX), ACTS=n activation rows (<= 16,
//   default 16) packed once, then 16 weight rows per call, else "-"). TYPE=Q6_K (a type's name):
//   that type only. Modes 2, 3, 4 and 5 count each weight byte once, whatever the activation rows.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>

#include "backends/cpu/quant.h"

using namespace moelite;
using namespace moelite::cpu;

namespace {

// Random quant bytes with fp16 scales forced to sane values (random bytes can be NaN).
std::vector<uint8_t> make_weights(TensorType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  uint64_t rb = 0;
  type_row_bytes(t, cols, &rb);
  std::vector<uint8_t> w(rb * rows);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const TypeInfo* info = type_info(static_cast<uint32_t>(t));
  std::vector<float> row(cols);
  const uint16_t scale = fp32_to_fp16(0.01f);
  int off[2] = {-1, -1};
  switch (t) {
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0: off[0] = 0; break;
    case TensorType::Q4_1:
    case TensorType::Q5_1:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
      off[0] = 0;
      off[1] = 2;
      break;
    case TensorType::Q2_K:
      off[0] = 80;
      off[1] = 82;
      break;
    case TensorType::Q3_K: off[0] = 108; break;
    case TensorType::Q6_K: off[0] = 208; break;
    case TensorType::MXFP4:  // E8M0 byte: scale 2^-7
      for (size_t b = 0; b < w.size() / info->block_bytes; ++b) w[b * info->block_bytes] = 121;
      break;
    case TensorType::F32:
      for (size_t i = 0; i + 4 <= w.size(); i += 4) {
        float f = 0.5f;
        std::memcpy(&w[i], &f, 4);
      }
      break;
    case TensorType::F16:
    case TensorType::BF16:
      for (size_t i = 0; i + 2 <= w.size(); i += 2) std::memcpy(&w[i], &scale, 2);
      break;
    default: break;
  }
  if (info->block_size > 1)
    for (size_t b = 0; b < w.size() / info->block_bytes; ++b)
      for (int o : off)
        if (o >= 0) std::memcpy(&w[b * info->block_bytes + o], &scale, 2);
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 2048;
  // mode 0: one vec_dot per row; 1: the drivers' decode path (tile on row pairs where there is one)
  const int mode = argc > 3 ? std::atoi(argv[3]) : 0;
  std::mt19937 rng(1);
  const TensorType types[] = {TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K, TensorType::Q5_K, TensorType::F16,
                              TensorType::F32,  TensorType::BF16, TensorType::Q4_0, TensorType::Q3_K, TensorType::Q2_K,
                              TensorType::Q5_0, TensorType::Q4_1, TensorType::Q5_1, TensorType::MXFP4};
  std::vector<const KernelTable*> tables = {&kernels_scalar()};
  if (kernels_avx2()) tables.push_back(kernels_avx2());
  if (kernels_avxvnni()) tables.push_back(kernels_avxvnni());
  if (kernels_avx512()) tables.push_back(kernels_avx512());
  if (kernels_amx()) tables.push_back(kernels_amx());
  for (const KernelTable* t : {kernels_neon(), kernels_dotprod(), kernels_i8mm()})
    if (t) tables.push_back(t);
  std::vector<float> x(cols);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::printf("%lld x %lld, single thread, GB/s of weight bytes (%s)\n%-6s", (long long)rows, (long long)cols,
              mode == 5 ? "matrix tile" : mode == 4 ? "rows in groups of eight" : mode == 3 ? "4 prepared activation rows" : mode == 2 ? "4 activation rows" : mode ? "tile path" : "vec_dot", "type");
  for (auto* t : tables) std::printf("%10s", t->isa);
  std::printf("\n");
  // TYPE=name: only that weight type (a type's measurement then does not depend on the others').
  const char* only = std::getenv("TYPE");
  for (TensorType t : types) {
    if (only && std::strcmp(only, type_name(t)) != 0) continue;
    auto w = make_weights(t, rows, cols, rng);
    const size_t rb = w.size() / rows;
    std::printf("%-6s", type_name(t));
    for (const KernelTable* k : tables) {
      std::vector<uint8_t> a(activation_row_bytes(t, cols) + 64);
      k->quantize_act[static_cast<uint32_t>(dot_type(t))](x.data(), a.data(), cols);
      VecDotFn dot = k->vec_dot[static_cast<uint32_t>(t)];
      VecDotTileFn tile = k->tile[static_cast<uint32_t>(t)];
      std::vector<float> out(rows * kMultiDot);
      double best = 1e30;
      const int reps = k == &kernels_scalar() ? 3 : 15;
      for (int rep = 0; rep < reps; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        if (mode == 5) {
          const MatrixTile& m = k->matrix[static_cast<uint32_t>(t)];
          if (!m.dot) break;
          const int acts = std::min(kMatrixTokens, getenv("ACTS") ? atoi(getenv("ACTS")) : kMatrixTokens);
          static std::vector<uint8_t> packed;
          static std::vector<uint8_t> act_rows;
          const size_t ab = activation_row_bytes(t, cols);
          act_rows.resize(ab * acts);
          for (int j = 0; j < acts; ++j) std::memcpy(act_rows.data() + j * ab, a.data(), ab);
          packed.resize(m.packed_bytes(cols));
          m.pack(act_rows.data(), ab, acts, cols, packed.data());
          // The drivers' task size: up to 1024 rows per call.
          static std::vector<float> o(static_cast<size_t>(1024) * kMatrixTokens);
          for (int64_t r = 0; r + kMatrixRows <= rows; r += 1024)
            m.dot(cols, o.data(), kMatrixTokens, w.data() + r * rb, rb, packed.data(), std::min<int64_t>(1024, rows - r) / kMatrixRows, acts);
        } else if (mode == 4) {
          const RowGroups& g = k->groups[static_cast<uint32_t>(t)];
          if (!g.dot) break;
          static std::vector<uint8_t> grouped;
          const size_t gb = g.group_bytes(cols);
          if (rep == 0) {
            grouped.resize(gb * static_cast<size_t>(rows / kGroupRows));
            for (int64_t r = 0; r + kGroupRows <= rows; r += kGroupRows)
              g.repack(w.data() + r * rb, rb, cols, grouped.data() + (r / kGroupRows) * gb);
            t0 = std::chrono::steady_clock::now();
          }
          // ACTS=n activation rows per call (at most the kernel's max_count; default 1).
          const int acts = std::min(g.max_count, getenv("ACTS") ? std::max(1, atoi(getenv("ACTS"))) : 1);
          static std::vector<uint8_t> act_rows;
          static std::vector<float> o;
          const size_t ab = activation_row_bytes(t, cols);
          act_rows.resize(ab * acts);
          for (int j = 0; j < acts; ++j) std::memcpy(act_rows.data() + j * ab, a.data(), ab);
          o.resize(static_cast<size_t>(rows) * kGroupTokens);
          // Two groups per call where the table takes pairs (as the drivers call it), else one.
          int64_t r = 0;
          if (g.dot_pair)
            for (; r + 2 * kGroupRows <= rows; r += 2 * kGroupRows)
              g.dot_pair(cols, &o[static_cast<size_t>(r) * kGroupTokens], kGroupTokens,
                         grouped.data() + (r / kGroupRows) * gb, gb, act_rows.data(), ab, acts);
          for (; r + kGroupRows <= rows; r += kGroupRows)
            g.dot(cols, &o[static_cast<size_t>(r) * kGroupTokens], kGroupTokens, grouped.data() + (r / kGroupRows) * gb, 0,
                  act_rows.data(), ab, acts);
        } else if (mode == 0) {
          for (int64_t r = 0; r < rows; ++r) dot(cols, &out[r], w.data() + r * rb, a.data());
        } else if (mode == 3) {
          // Batched through the prepared tile (where the table has one); GB/s counts each weight
          // byte once, like mode 2.
          const PreparedTile& p = k->prepared[static_cast<uint32_t>(t)];
          if (!p.tile) break;
          static std::vector<uint8_t> prep;
          const size_t pb = p.prepared_bytes(cols);
          // ACTS=n: n activation rows per weight row group, kMultiDot per call (prefill of an expert
          // with n tokens).
          const int acts = getenv("ACTS") ? atoi(getenv("ACTS")) : kMultiDot;
          prep.resize(pb * acts);
          for (int j = 0; j < acts; ++j) p.prepare(a.data(), cols, prep.data() + j * pb);
          int64_t r = 0;
          for (; r + p.rows <= rows; r += p.rows)
            for (int j = 0; j < acts; j += kMultiDot)
              p.tile(cols, &out[r * kMultiDot], kMultiDot, w.data() + r * rb, rb, prep.data() + j * pb, pb,
                     std::min(kMultiDot, acts - j));
        } else if (mode == 2) {
          // Batched (prefill): kMultiDot activation rows per weight row (pair), GB/s counts each
          // weight byte once, so it is kMultiDot times the work of mode 0 per byte.
          int64_t r = 0;
          if (VecDotTileFn tile4 = k->tile4[static_cast<uint32_t>(t)])
            for (; r + kQuadRows <= rows; r += kQuadRows)
              tile4(cols, &out[r * kMultiDot], kMultiDot, w.data() + r * rb, rb, a.data(), 0, kMultiDot);
          if (tile)
            for (; r + kTileRows <= rows; r += kTileRows)
              tile(cols, &out[r * kMultiDot], kMultiDot, w.data() + r * rb, rb, a.data(), 0, kMultiDot);
          for (; r < rows; ++r)
            k->vec_dot_multi[static_cast<uint32_t>(t)](cols, &out[r * kMultiDot], w.data() + r * rb, a.data(), 0, kMultiDot);
        } else {
          // The drivers' decode path: row pairs through the tile where the table has one.
          int64_t r = 0;
          if (tile)
            for (; r + kTileRows <= rows; r += kTileRows) tile(cols, &out[r], 1, w.data() + r * rb, rb, a.data(), 0, 1);
          for (; r < rows; ++r) dot(cols, &out[r], w.data() + r * rb, a.data());
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s < best) best = s;
      }
      std::printf("%10.2f", w.size() / best / 1e9);
    }
    std::printf("\n");
  }
  return 0;
}
