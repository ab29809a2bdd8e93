// Every operation of the CUDA backend against a CPU reference (llama.cpp's test-backend-ops
// pattern), run through the SIMT emulator: the kernels' own source, compiled for the CPU, on an
// emulated device whose streams run only when waited for. Matrix products and row lookups for
// every weight type (float weights against the scalar dequantization in float64, quantized ones,
// whose products are integer dot products of quantized activations, against the CPU's scalar
// integer dot product; the quantized activations bit for bit), at shapes with tails (odd rows,
// float rows not a multiple of 32, token counts around the 8-token chunk); norms, RoPE, attention,
// routing and the expert FFNs against the CPU backend's float paths; a token's result bitwise the
// same in any batch; both device kinds (integrated: zero-copy expert slots; discrete: device tier).
// The same tests run on a real GPU when the machine has one (the `gpu` instances; skipped, with the
// driver's reason, elsewhere): the kernels nvcc compiled, against the same CPU references.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/quant.h"
#include "base/quant_ref.h"
#include "core/moe/expert_executor.h"
#include "tests/backend_ops_util.h"
#include "tests/random_weights.h"
#if MOELITE_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gpu_runtime.h"
#endif

using namespace moelite;
using namespace moelite::test;

#if MOELITE_HAVE_CUDA
namespace {

enum class Device { EmulatedIntegrated, EmulatedDiscrete, Gpu };
const char* device_name(Device d) {
  return d == Device::EmulatedIntegrated ? "integrated" : d == Device::EmulatedDiscrete ? "discrete" : "gpu";
}
// How gtest prints the parameter (the test list, failures): the name, not the enum's bytes.
void PrintTo(Device d, std::ostream* os) { *os << device_name(d); }

struct Pair {
  std::unique_ptr<Backend> gpu, cpu;
  std::string why_no_gpu;  // set when the real device is not there (the test is skipped)
};

Pair make(Device device) {
  Pair p;
  EXPECT_EQ(cpu::CpuBackend::create(1, &p.cpu), MOELITE_OK);
  if (device == Device::Gpu) {
    std::unique_ptr<cuda::GpuRuntime> rt;
    if (cuda::open_cuda_runtime(&rt) != MOELITE_OK) {
      p.why_no_gpu = last_error_message();
      return p;
    }
    EXPECT_EQ(cuda::CudaBackend::create_with(std::move(rt), &p.gpu), MOELITE_OK) << last_error_message();
    return p;
  }
  const bool integrated = device == Device::EmulatedIntegrated;
  std::unique_ptr<cuda::GpuRuntime> rt;
  EXPECT_EQ(cuda::open_emulated_runtime(integrated, &rt), MOELITE_OK) << last_error_message();
  EXPECT_EQ(cuda::CudaBackend::create_with(std::move(rt), &p.gpu), MOELITE_OK);
  return p;
}

// Every test starts with this: the pair for the instance's device, or a skip naming why the real
// GPU is not there.
#define MAKE_PAIR_OR_SKIP(p)                                    \
  Pair p = make(GetParam());                                    \
  if (!p.gpu && !p.why_no_gpu.empty()) GTEST_SKIP() << "no CUDA device: " << p.why_no_gpu; \
  ASSERT_NE(p.gpu, nullptr)

// The same weight with its first byte `offset` bytes past a 16-byte boundary (kept).
WeightView misaligned(const WeightView& w, size_t offset) {
  static std::deque<std::vector<uint8_t>> kept;
  const size_t size = static_cast<size_t>(w.rows) * w.row_bytes;
  kept.emplace_back(size + 32);
  uint8_t* base = kept.back().data();
  uint8_t* at = base + ((16 - reinterpret_cast<uintptr_t>(base) % 16) % 16) + offset;
  std::memcpy(at, w.data, size);
  WeightView m = w;
  m.data = at;
  return m;
}

}  // namespace

class CudaDevices : public testing::TestWithParam<Device> {};

// What the CPU's scalar integer dot product gives for a quantized weight (the activations quantized
// by the scalar quantizer of its dot format), and the size of the sum's terms: want[t][r],
// magnitude[t][r] = bias[r] + dot, sum_c |w[r][c] x[t][c]|. The integer products' reference.
void scalar_integer_product(const WeightView& w, const std::vector<float>& x, const std::vector<float>& bias,
                            int64_t n, std::vector<double>* want, std::vector<double>* magnitude) {
  const cpu::KernelTable& k = cpu::kernels_scalar();
  const TensorType dot = cpu::dot_type(w.type);
  const std::vector<float> deq = dequantized(w);
  std::vector<uint8_t> q(cpu::activation_row_bytes(w.type, w.cols));
  want->assign(static_cast<size_t>(n * w.rows), 0.0);
  magnitude->assign(want->size(), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * w.cols;
    k.quantize_act[static_cast<uint32_t>(dot)](xt, q.data(), w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      float d;
      k.vec_dot[static_cast<uint32_t>(w.type)](w.cols, &d, w.data + r * w.row_bytes, q.data());
      double m = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) m += std::abs(double(deq[static_cast<size_t>(r * w.cols + c)]) * xt[c]);
      (*want)[static_cast<size_t>(t * w.rows + r)] = double(d) + bias[static_cast<size_t>(r)];
      (*magnitude)[static_cast<size_t>(t * w.rows + r)] = m;
    }
  }
}

TEST_P(CudaDevices, MatmulAndGetRowsForEveryWeightTypeMatchTheScalarReference) {
  // Float weights against the scalar dequantization in float64; quantized weights (integer
  // products, activations quantized on the device) against the CPU's scalar integer dot product,
  // which they equal but for the order of float additions: within 1e-5 of the sum of the terms'
  // magnitudes (one wrong weight code among 16 384 columns is 6e-5 of it).
  MAKE_PAIR_OR_SKIP(p);
  std::mt19937 rng(11);
  for (TensorType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const bool is_float = t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16;
    // Rows not a multiple of the 4 rows per block; float rows with a partial last 32-column chunk;
    // rows longer than a warp's 4 KB stage (two or more staged chunks, the last one partial), and
    // rows starting 3 bytes past a 16-byte boundary (the stage's loads are aligned down).
    const std::vector<int64_t> widths =
        is_float ? std::vector<int64_t>{100, 512, 2500} : std::vector<int64_t>{256, 1024 + 256, 16384 + 256};
    for (const int64_t cols : widths) {
      const int64_t rows = 9, n = 11;  // tokens: one full chunk of 8 and a partial one
      const WeightView w = cols == widths.back() ? misaligned(random_matrix(t, rows, cols, rng), 3)
                                                 : random_matrix(t, rows, cols, rng);
      const std::vector<float> deq = dequantized(w);
      const std::vector<float> x = randv(static_cast<size_t>(n * cols), rng, -2, 2);
      const std::vector<float>& bias = kept_floats(randv(rows, rng));
      ASSERT_EQ(p.gpu->place_weight(w), MOELITE_OK);
      HostAct xa(p.gpu.get(), n, cols), ya(p.gpu.get(), n, rows);
      xa.set(x);
      ASSERT_EQ(p.gpu->matmul(w, xa.a, bias.data(), &ya.a), MOELITE_OK);
      const std::vector<float> batched = ya.get();
      if (is_float) {
        EXPECT_LT(max_rel(batched, reference_product(deq, x, bias, rows, cols, n)), 2e-6) << cols << " columns";
      } else {
        std::vector<double> want, magnitude;
        scalar_integer_product(w, x, bias, n, &want, &magnitude);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_LE(std::abs(double(batched[i]) - want[i]), 1e-5 * magnitude[i])
              << cols << " columns, output " << i << ": " << batched[i] << " against " << want[i];
      }
      // Each token alone gives bitwise the batch's result (decode = prefill).
      for (int64_t tok : {int64_t(0), int64_t(9)}) {
        Act xv = p.gpu->view_rows(xa.a, tok, 1);
        HostAct one(p.gpu.get(), 1, rows);
        ASSERT_EQ(p.gpu->matmul(w, xv, bias.data(), &one.a), MOELITE_OK);
        const std::vector<float> got = one.get();
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(got[static_cast<size_t>(r)], batched[static_cast<size_t>(tok * rows + r)]) << "token " << tok;
      }
      // get_rows: dequantization is exact.
      const int32_t ids[] = {4, 0, 8};
      HostAct ga(p.gpu.get(), 3, cols);
      ASSERT_EQ(p.gpu->get_rows(w, ids, 3, &ga.a), MOELITE_OK);
      const std::vector<float> got = ga.get();
      for (int i = 0; i < 3; ++i)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(got[static_cast<size_t>(i * cols + c)], deq[static_cast<size_t>(ids[i] * cols + c)])
              << "row " << ids[i] << " col " << c;
    }
  }
  ASSERT_EQ(p.gpu->sync(), MOELITE_OK);
}

// The device's quantized activations against the CPU's scalar quantizers, bit for bit: codes,
// fp16-rounded scales, Q8_1's sums and Q8_K's f32 scale and sums of 16, through a row map, on rows
// that probe the arithmetic (ties at .5 that round half away for Q8_0 and to even for Q8_K, a
// largest magnitude reached by both signs, the first one deciding Q8_K's sign, zeros, scales below
// fp16's range).
TEST_P(CudaDevices, QuantizedActivationsAreTheCpusBitForBit) {
  std::unique_ptr<cuda::GpuRuntime> rt;
  if (GetParam() == Device::Gpu) {
    if (cuda::open_cuda_runtime(&rt) != MOELITE_OK) GTEST_SKIP() << "no CUDA device: " << last_error_message();
  } else {
    ASSERT_EQ(cuda::open_emulated_runtime(GetParam() == Device::EmulatedIntegrated, &rt), MOELITE_OK);
  }
  const int64_t cols = 512, n_in = 7;
  std::mt19937 rng(5);
  std::vector<float> x = randv(static_cast<size_t>(n_in * cols), rng, -3, 3);
  auto row = [&](int64_t r) { return x.data() + r * cols; };
  for (int64_t c = 0; c < cols; ++c) {
    row(1)[c] = 0.0f;                                                   // all zero
    row(2)[c] = float(c % 253) - 126.5f;                                // ties: d = 1 where 127 is the max
    row(3)[c] = (c % 7 == 0) ? 5.0f : (c % 7 == 3) ? -5.0f : float(c % 5) * 0.7f;  // +5 before -5
    row(4)[c] = (c % 7 == 0) ? -5.0f : (c % 7 == 3) ? 5.0f : float(c % 5) * 0.7f;  // -5 before +5
    row(5)[c] = float(c % 9 - 4) * 1e-30f;                              // d below fp16's smallest
  }
  for (int64_t c = 0; c < cols; c += 32) row(2)[c] = -127.0f;  // every block's max: 127 exactly
  const std::vector<int32_t> map = {3, 0, 2, 1, 4, 5, 6, 2};
  const int64_t n = static_cast<int64_t>(map.size());
  void *dx, *dmap, *dout;
  cuda::StreamHandle s;
  ASSERT_EQ(rt->stream_create(&s), MOELITE_OK);
  ASSERT_EQ(rt->device_alloc(x.size() * sizeof(float), &dx), MOELITE_OK);
  ASSERT_EQ(rt->device_alloc(map.size() * sizeof(int32_t), &dmap), MOELITE_OK);
  ASSERT_EQ(rt->copy_async(dx, x.data(), x.size() * sizeof(float), s), MOELITE_OK);
  ASSERT_EQ(rt->copy_async(dmap, map.data(), map.size() * sizeof(int32_t), s), MOELITE_OK);
  const cpu::KernelTable& k = cpu::kernels_scalar();
  const struct {
    int format;
    TensorType cpu;
  } formats[] = {{cuda_kernels::kActQ8_0, TensorType::Q8_0},
                 {cuda_kernels::kActQ8_1, TensorType::Q8_1},
                 {cuda_kernels::kActQ8_K, TensorType::Q8_K}};
  for (const auto& f : formats) {
    SCOPED_TRACE(type_name(f.cpu));
    const cuda_kernels::ActRowLayout l = cuda_kernels::act_row_layout(f.format, cols);
    std::vector<uint8_t> got(static_cast<size_t>(n * l.bytes));
    ASSERT_EQ(rt->device_alloc(got.size(), &dout), MOELITE_OK);
    ASSERT_EQ(rt->kernels().quantize_act(s, f.format, static_cast<const float*>(dx), cols,
                                         static_cast<const int32_t*>(dmap), n, cols, static_cast<uint8_t*>(dout)),
              MOELITE_OK);
    ASSERT_EQ(rt->copy_async(got.data(), dout, got.size(), s), MOELITE_OK);
    ASSERT_EQ(rt->stream_sync(s), MOELITE_OK) << last_error_message();
    rt->device_free(dout);
    std::vector<uint8_t> want(static_cast<size_t>(cols) * 2);  // more than any format's row
    for (int64_t r = 0; r < n; ++r) {
      SCOPED_TRACE(testing::Message() << "row " << r << " (input " << map[static_cast<size_t>(r)] << ")");
      k.quantize_act[static_cast<uint32_t>(f.cpu)](row(map[static_cast<size_t>(r)]), want.data(), cols);
      const uint8_t* g = got.data() + r * l.bytes;
      auto scale = [&](int64_t b) { float v; std::memcpy(&v, g + l.scales + 4 * b, 4); return v; };
      auto sum = [&](int64_t i) { int32_t v; std::memcpy(&v, g + l.sums + 4 * i, 4); return v; };
      auto same = [](float a, float b) { uint32_t x, y; std::memcpy(&x, &a, 4); std::memcpy(&y, &b, 4); return x == y; };
      if (f.format == cuda_kernels::kActQ8_K) {
        for (int64_t b = 0; b < cols / 256; ++b) {
          const auto& blk = reinterpret_cast<const blocks::Q8_K*>(want.data())[b];
          ASSERT_TRUE(same(scale(b), q8k_d(blk))) << "block " << b << ": " << scale(b) << " against " << q8k_d(blk);
          for (int i = 0; i < 256; ++i) ASSERT_EQ(int8_t(g[b * 256 + i]), blk.qs[i]) << "block " << b << " code " << i;
          for (int i = 0; i < 16; ++i) ASSERT_EQ(sum(b * 16 + i), q8k_bsum(blk, i)) << "block " << b << " sum " << i;
        }
      } else {
        const size_t block_bytes = f.format == cuda_kernels::kActQ8_0 ? sizeof(blocks::Q8_0) : sizeof(blocks::Q8_1);
        for (int64_t b = 0; b < cols / 32; ++b) {
          const uint8_t* blk = want.data() + b * block_bytes;
          const int8_t* qs = reinterpret_cast<const int8_t*>(blk + (f.format == cuda_kernels::kActQ8_0 ? 2 : 4));
          ASSERT_TRUE(same(scale(b), load_fp16(blk))) << "block " << b;
          if (f.format == cuda_kernels::kActQ8_1) {
            float s_want = load_fp16(blk + 2), s_got;
            std::memcpy(&s_got, g + l.sums + 4 * b, 4);
            ASSERT_TRUE(same(s_got, s_want)) << "block " << b << " s";
          }
          for (int i = 0; i < 32; ++i) ASSERT_EQ(int8_t(g[b * 32 + i]), qs[i]) << "block " << b << " code " << i;
        }
      }
    }
  }
  rt->device_free(dx);
  rt->device_free(dmap);
  rt->stream_destroy(s);
}

TEST_P(CudaDevices, FloatOpsMatchTheCpuBackend) {
  MAKE_PAIR_OR_SKIP(p);
  expect_float_ops_match_cpu(p.gpu.get(), p.cpu.get());
}

TEST_P(CudaDevices, AttentionWholeAndWindowedWithSinksMatchesTheDefinition) {
  // A prompt of 600: three chunks of the split attention, ten slices of 64 tokens.
  MAKE_PAIR_OR_SKIP(p);
  expect_attention_matches_cpu(p.gpu.get(), p.cpu.get(), 600, 700);
}

TEST_P(CudaDevices, AttentionOfAPositionIsTheSameInAnyBatch) {
  // The split depends only on positions: token 300 attends bitwise alike whether it comes in a
  // prompt of 400 or alone after a prompt of 300.
  MAKE_PAIR_OR_SKIP(p);
  const int32_t n_head = 2, n_head_kv = 1, head_dim = 32, n_ctx = 512;
  const int64_t q_dim = n_head * head_dim, kv_dim = n_head_kv * head_dim;
  std::mt19937 rng(8);
  const std::vector<float> q = randv(static_cast<size_t>(400 * q_dim), rng, -2, 2),
                           k = randv(static_cast<size_t>(400 * kv_dim), rng, -2, 2),
                           v = randv(static_cast<size_t>(400 * kv_dim), rng);
  auto rows = [](const std::vector<float>& a, int64_t cols, int64_t r0, int64_t n) {
    return std::vector<float>(a.begin() + r0 * cols, a.begin() + (r0 + n) * cols);
  };
  Backend* b = p.gpu.get();
  std::vector<std::vector<float>> token300;
  for (const int64_t split : {int64_t(400), int64_t(300)}) {
    KvCache kv;
    ASSERT_EQ(b->alloc_kv(n_ctx, {n_ctx}, kv_dim, true, &kv), MOELITE_OK);
    std::vector<float> got;
    for (int64_t r0 = 0; r0 < 400; r0 += split) {
      const int64_t n = std::min<int64_t>(split, 400 - r0);
      HostAct qa(b, n, q_dim), ka(b, n, kv_dim), va(b, n, kv_dim), o(b, n, q_dim);
      qa.set(rows(q, q_dim, r0, n)), ka.set(rows(k, kv_dim, r0, n)), va.set(rows(v, kv_dim, r0, n));
      ASSERT_EQ(b->attention(&kv, 0, qa.a, ka.a, va.a, static_cast<int32_t>(r0), n_head, n_head_kv, head_dim,
                            AttentionSpec{}, &o.a),
                MOELITE_OK);
      const std::vector<float> out = o.get();
      got.insert(got.end(), out.begin(), out.end());
    }
    b->free_kv(&kv);
    token300.push_back(rows(got, q_dim, 300, 1));
  }
  EXPECT_EQ(token300[0], token300[1]);
}

TEST_P(CudaDevices, LatentAttentionFromAKeysOnlyCacheMatchesTheDefinition) {
  // A prompt of 300: two chunks of the split attention.
  MAKE_PAIR_OR_SKIP(p);
  expect_latent_attention_matches_cpu(p.gpu.get(), p.cpu.get(), 300, 340);
}

TEST_P(CudaDevices, CopyColumnsMatchesTheDefinition) {
  MAKE_PAIR_OR_SKIP(p);
  expect_copy_columns_match_definition(p.gpu.get());
}

TEST_P(CudaDevices, RoutingMatchesTheCpuBackend) {
  MAKE_PAIR_OR_SKIP(p);
  expect_routing_matches_cpu(p.gpu.get(), p.cpu.get(), 70);  // more tokens than one 64-thread block
}

TEST_P(CudaDevices, ExpertAndSharedFfnsMatchTheCpuBackend) {
  // Both activations (SwiGLU; gpt-oss's clamped SwiGLU with per-expert biases), resident and as
  // budgeted experts (a source that is not all-resident: zero-copy reads on the integrated device,
  // the device tier on the discrete one), with quantized and float weights.
  MAKE_PAIR_OR_SKIP(p);
  std::mt19937 rng(4);
  const int64_t n = 4, d = 256, ff = 96;
  const int32_t n_expert = 5, k = 2;
  std::deque<std::vector<float>> store;
  auto floats = [&](int64_t count, float scale) {
    store.push_back(randv(static_cast<size_t>(count), rng, -scale, scale));
    return store.back().data();
  };
  Routing r;
  r.n_tokens = static_cast<int32_t>(n);
  r.k = k;
  r.ids = {3, 1, 1, 4, 0, -1, 3, 2};  // token 2 uses one expert (a slot dropped by gating)
  r.weights = {0.6f, 0.4f, 0.7f, 0.3f, 1.0f, 0.0f, 0.5f, 0.5f};
  const std::vector<float> x = randv(static_cast<size_t>(n * d), rng, -2, 2);
  static const std::vector<float> gate_inp = randv(static_cast<size_t>(d), rng);
  // Gate and up of one type are one fused, grouped product; of two types (a mixed quantization)
  // they are computed apart.
  const std::pair<TensorType, TensorType> gate_up_types[] = {
      {TensorType::F32, TensorType::F32}, {TensorType::Q4_K, TensorType::Q4_K}, {TensorType::Q4_K, TensorType::Q8_0}};
  for (const auto& [type, up_type] : gate_up_types) {
    for (const FfnActivation act : {FfnActivation::SwiGLU, FfnActivation::SwiGLUClamped}) {
      SCOPED_TRACE(testing::Message() << type_name(type) << "/" << type_name(up_type) << " activation "
                                      << static_cast<int>(act));
      const bool biased = act == FfnActivation::SwiGLUClamped;
      FfnKind kind;
      kind.activation = act;
      kind.limit = 0.5f;  // small enough that the clamp is exercised
      // The reference is the CPU backend on the same weights: quantized ones through its integer
      // dot products, with the activations quantized as the device quantizes them (the same codes
      // and scales), so the two differ only in the order of float additions.
      FakeExperts ex, ex_ref;
      // Down rows of ff = 96 columns: Q4_K needs 256, so down stays F32.
      auto expert = [&](ExpertWeights* ref) {
        ExpertWeights w{random_matrix(type, ff, d, rng), random_matrix(up_type, ff, d, rng),
                        random_matrix(TensorType::F32, d, ff, rng)};
        if (biased) {
          w.gate_bias = floats(ff, 0.5f);
          w.up_bias = floats(ff, 0.5f);
          w.down_bias = floats(d, 0.5f);
        }
        *ref = w;
        return w;
      };
      for (int32_t e = 0; e < n_expert; ++e) {
        ExpertWeights ref;
        ex.w.push_back(expert(&ref));
        ex_ref.w.push_back(ref);
      }
      ExpertWeights shared_ref;
      const ExpertWeights shared = expert(&shared_ref);
      std::vector<float> gpu_resident;
      for (const bool resident : {true, false}) {
        ex.resident = ex_ref.resident = resident;
        std::vector<std::vector<float>> moe, dense;
        for (Backend* b : {p.gpu.get(), p.cpu.get()}) {
          const bool gpu = b == p.gpu.get();
          HostAct xa(b, n, d), o(b, n, d), s(b, n, d);
          xa.set(x);
          FakeExperts& source = gpu ? ex : ex_ref;
          ASSERT_EQ(run_routed_experts(*b, source, 0, kind, xa.a, r, &o.a), MOELITE_OK) << last_error_message();
          moe.push_back(o.get());
          ASSERT_EQ(b->dense_ffn(gpu ? shared : shared_ref, kind, gate_inp.data(), xa.a, &s.a), MOELITE_OK);
          dense.push_back(s.get());
          ASSERT_EQ(source.held, 0) << "every expert is released";
        }
        EXPECT_LT(max_rel(moe[0], widen(moe[1])), 1e-5) << " resident " << resident;
        EXPECT_LT(max_rel(dense[0], widen(dense[1])), 1e-5);
        // Each token alone (decode: every product has one token, so the one-token kernels run)
        // gives bitwise its row of the batch (products of up to 8 tokens a warp).
        for (int32_t tok : {0, 3}) {
          Routing one;
          one.n_tokens = 1;
          one.k = k;
          one.ids.assign(r.ids.begin() + tok * k, r.ids.begin() + (tok + 1) * k);
          one.weights.assign(r.weights.begin() + tok * k, r.weights.begin() + (tok + 1) * k);
          HostAct xa(p.gpu.get(), 1, d), o(p.gpu.get(), 1, d);
          xa.set(std::vector<float>(x.begin() + tok * d, x.begin() + (tok + 1) * d));
          ASSERT_EQ(run_routed_experts(*p.gpu, ex, 0, kind, xa.a, one, &o.a), MOELITE_OK) << last_error_message();
          EXPECT_EQ(o.get(), std::vector<float>(moe[0].begin() + tok * d, moe[0].begin() + (tok + 1) * d))
              << "token " << tok << " alone, resident " << resident;
        }
        if (resident)
          gpu_resident = moe[0];
        else
          EXPECT_EQ(moe[0], gpu_resident) << "budgeted experts give bitwise the resident result";
      }
    }
  }
}

TEST_P(CudaDevices, DeviceBandwidthIsMeasured) {
  MAKE_PAIR_OR_SKIP(p);
  double gbs = 0.0;
  ASSERT_EQ(p.gpu->measure_memory_bandwidth(&gbs), MOELITE_OK) << last_error_message();
  // Emulated: host memcpy speed. A real GPU's memory is at least this fast (a Jetson Orin Nano's
  // is 68 GB/s); a lower figure means the measurement is wrong.
  EXPECT_GT(gbs, GetParam() == Device::Gpu ? 20.0 : 0.01);
  EXPECT_EQ(p.cpu->measure_memory_bandwidth(&gbs), MOELITE_ERR_NOT_IMPLEMENTED);
}

INSTANTIATE_TEST_SUITE_P(CudaOps, CudaDevices,
                         testing::Values(Device::EmulatedIntegrated, Device::EmulatedDiscrete, Device::Gpu),
                         [](const testing::TestParamInfo<Device>& i) { return device_name(i.param); });

namespace {

TierCounts cuda_tier_counts(Backend* b) {
  const cuda::CudaBackend::TierStats t = static_cast<cuda::CudaBackend*>(b)->tier_stats();
  return {t.hits, t.loads, t.own_copies};
}

}  // namespace

TEST(CudaOps, PeersShareTheDeviceTierWithoutWaitingForEachOther) {
  // On the emulated discrete device, whose streams run only when waited for: a slot held part way
  // through one instance's pass is neither read nor refilled by a peer's whole pass
  // (backend_ops_util.h).
  Pair p = make(Device::EmulatedDiscrete);
  ASSERT_NE(p.gpu, nullptr);
  p.gpu->set_device_tier_slots(2);
  std::unique_ptr<Backend> peer;
  ASSERT_EQ(p.gpu->create_peer(&peer), MOELITE_OK) << last_error_message();
  expect_peers_share_a_tier_without_waiting(p.gpu.get(), peer.get(), p.cpu.get(), cuda_tier_counts);
}

TEST(CudaOps, PeersPassingExpertsThroughOneTierAtOnceComputeWhatTheCpuDoes) {
  Pair p = make(Device::EmulatedDiscrete);
  ASSERT_NE(p.gpu, nullptr);
  p.gpu->set_device_tier_slots(3);
  std::vector<std::unique_ptr<Backend>> peers(2);
  for (auto& peer : peers) ASSERT_EQ(p.gpu->create_peer(&peer), MOELITE_OK);
  expect_peers_through_one_tier_compute_what_the_cpu_does({p.gpu.get(), peers[0].get(), peers[1].get()}, p.cpu.get(),
                                                          cuda_tier_counts);
  peers.clear();  // peers go before the instance they were made from
}

TEST(CudaOps, EmulatedStreamWaitsOnAnEventOfAStreamDestroyedSince) {
  // A peer's context may be freed (its streams destroyed) while another instance's stream still
  // has a wait for one of its events queued, e.g. for a device-tier slot it released. On a GPU the
  // event stays valid; the emulator kept the stream's address and ran it after its deletion (a
  // crash in concurrency_cuda, once in a few runs). The wait now finds the stream's work done.
  std::unique_ptr<cuda::GpuRuntime> rt;
  ASSERT_EQ(cuda::open_emulated_runtime(/*integrated=*/false, &rt), MOELITE_OK);
  cuda::StreamHandle a = nullptr, b = nullptr;
  cuda::EventHandle e = nullptr;
  ASSERT_EQ(rt->stream_create(&a), MOELITE_OK);
  ASSERT_EQ(rt->stream_create(&b), MOELITE_OK);
  ASSERT_EQ(rt->event_create(&e), MOELITE_OK);
  void* dev = nullptr;
  ASSERT_EQ(rt->device_alloc(sizeof(int), &dev), MOELITE_OK);
  static const int value = 42;
  ASSERT_EQ(rt->copy_async(dev, &value, sizeof value, a), MOELITE_OK);
  ASSERT_EQ(rt->event_record(e, a), MOELITE_OK);
  ASSERT_EQ(rt->stream_wait(b, e), MOELITE_OK);
  int back = 0;
  ASSERT_EQ(rt->copy_async(&back, dev, sizeof back, b), MOELITE_OK);
  rt->stream_destroy(a);  // runs a's copy first, as cudaStreamDestroy lets queued work finish
  EXPECT_EQ(rt->stream_sync(b), MOELITE_OK) << last_error_message();
  EXPECT_EQ(back, 42);
  EXPECT_EQ(rt->event_sync(e), MOELITE_OK);  // an event of a destroyed stream is complete
  rt->event_destroy(e);
  rt->device_free(dev);
  rt->stream_destroy(b);
}

TEST(CudaOps, WithoutADeviceTheBackendIsUnavailableWithAReason) {
  unsetenv("MOELITE_CUDA_EMULATOR");
  std::unique_ptr<Backend> b;
  const Status st = cuda::CudaBackend::create(&b);
  if (st == MOELITE_OK) GTEST_SKIP() << "this machine has a CUDA device: " << b->name();
  EXPECT_EQ(st, MOELITE_ERR_BACKEND_UNAVAILABLE);
  const std::string msg = last_error_message();
  EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MOELITE_CUDA_EMULATOR"), std::string::npos) << msg;
  setenv("MOELITE_CUDA_EMULATOR", "sideways", 1);
  EXPECT_EQ(cuda::CudaBackend::create(&b), MOELITE_ERR_INVALID_ARGUMENT);
  unsetenv("MOELITE_CUDA_EMULATOR");
}

#else
TEST(CudaOps, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif
