#include "core/experts/expert_read_probe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <system_error>
#include <thread>
#include <vector>

#include "core/experts/expert_reads.h"
#include "core/model/model.h"
#include "platforms/batch_read.h"
#include "platforms/platform.h"

namespace moelite {

namespace {

// memcpy of expert-sized pieces between two 128 MiB buffers (well past a cache), best of two passes.
double measure_copy(uint64_t piece) {
  constexpr size_t kBytes = size_t{128} << 20;
  platform::AlignedBytes src(kBytes, platform::kDirectIoAlignment), dst(kBytes, platform::kDirectIoAlignment);
  if (!src.bytes() || !dst.bytes()) return 0.0;
  memset(src.bytes(), 1, kBytes);
  memset(dst.bytes(), 2, kBytes);
  piece = std::clamp<uint64_t>(piece, 4096, kBytes);
  double best = 0.0;
  for (int pass = 0; pass < 2; ++pass) {
    const double t0 = platform::now_seconds();
    for (size_t at = 0; at + piece <= kBytes; at += piece)
      memcpy(dst.bytes() + at, src.bytes() + at, piece);
    const double dt = platform::now_seconds() - t0;
    if (dt > 0) best = std::max(best, static_cast<double>(kBytes / piece * piece) / dt / 1e9);
  }
  return best;
}

}  // namespace

Status probe_expert_reads(const Model& model, int32_t loaders, uint64_t bytes, ExpertReadProbe* out) {
  if (loaders < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "the storage probe needs at least one loader, not %d", loaders);
  const ExpertReads plan(model);
  std::vector<int32_t> layers;
  uint64_t total_expert_bytes = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!model.layers[l].experts.present()) continue;
    layers.push_back(static_cast<int32_t>(l));
    total_expert_bytes += plan.expert_bytes(static_cast<int32_t>(l));
  }
  if (layers.empty() || model.hp.n_expert < 1)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the model has no routed experts to read");
  const uint64_t slot = plan.slot_bytes();
  const size_t batch = plan.experts_per_submission();

  platform::File file;
  if (platform::File::open_direct(plan.path(), &file) != MOELITE_OK) {
    clear_error();
    MOELITE_TRY(platform::File::open(plan.path(), &file));
  }
  struct Loader {
    std::unique_ptr<platform::BatchReader> reader;
    std::unique_ptr<platform::AlignedBytes> buffer;
    std::vector<platform::ReadRange> ranges;
    std::vector<uint8_t> matrices_in;
    uint64_t landed = 0, reads = 0, requested = 0;
    Status status = MOELITE_OK;
    std::string why;
  };
  std::vector<Loader> pool(static_cast<size_t>(loaders));
  try {
    for (Loader& d : pool) {
      d.reader = ExpertReads::loader_reader();
      d.buffer = std::make_unique<platform::AlignedBytes>(static_cast<size_t>(slot * batch), platform::kDirectIoAlignment);
      if (!d.buffer->bytes()) return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory for the storage probe's buffers");
      d.ranges.reserve(kLoaderReadsPerSubmission);
      d.matrices_in.reserve(kLoaderReadsPerSubmission);
    }
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory for the storage probe's readers");
  }
  // Submissions are handed out from one counter until `bytes` are asked for; submission i reads the
  // experts a generator seeded by i picks, so the reads are the same whichever loader takes it.
  const uint64_t per_submission = std::max<uint64_t>(1, total_expert_bytes / layers.size() * batch);
  const uint64_t submissions = std::max<uint64_t>(static_cast<uint64_t>(loaders), bytes / per_submission);
  std::atomic<uint64_t> next{0};
  auto run = [&](size_t t) {
    Loader& d = pool[t];
    for (uint64_t i; (i = next.fetch_add(1)) < submissions;) {
      std::mt19937_64 rng(0x5eed + i);
      d.ranges.clear();
      d.matrices_in.clear();
      uint8_t* mem = d.buffer->bytes();
      for (size_t k = 0; k < batch; ++k, mem += slot) {
        const int32_t l = layers[rng() % layers.size()];
        const int32_t e = static_cast<int32_t>(rng() % static_cast<uint64_t>(model.hp.n_expert));
        plan.append_reads(l, e, file.native_handle(), file.is_direct(), mem, &d.ranges, &d.matrices_in);
      }
      for (const platform::ReadRange& r : d.ranges) d.requested += r.len;
      uint64_t got = 0;
      d.status = d.reader->read_all(
          d.ranges, [](size_t) {}, &got, plan.bytes_in_flight());
      if (d.status != MOELITE_OK) {
        d.why = last_error_message();
        return;
      }
      if (!file.is_direct())
        for (const platform::ReadRange& r : d.ranges) file.drop_cache(r.offset, r.len);
      d.landed += got;
      d.reads += d.ranges.size();
    }
  };
  const double t0 = platform::now_seconds();
  std::vector<std::thread> threads;
  try {
    for (size_t t = 1; t < pool.size(); ++t) threads.emplace_back(run, t);
  } catch (const std::system_error&) {
    next = submissions;  // the started ones stop at their next submission
    for (std::thread& th : threads) th.join();
    return fail(MOELITE_ERR_SYSTEM_LIMIT, "the system refused a thread for the storage probe");
  }
  run(0);
  for (std::thread& th : threads) th.join();
  const double seconds = platform::now_seconds() - t0;
  ExpertReadProbe r;
  uint64_t landed = 0, reads = 0, requested = 0;
  for (const Loader& d : pool) {
    if (d.status != MOELITE_OK) return fail(d.status, "the storage probe: %s", d.why.c_str());
    landed += d.landed, reads += d.reads, requested += d.requested;
  }
  r.gb_per_s = seconds > 0 ? static_cast<double>(landed) / seconds / 1e9 : 0.0;
  r.reads_per_s = seconds > 0 ? static_cast<double>(reads) / seconds : 0.0;
  r.read_bytes = reads ? static_cast<double>(requested) / static_cast<double>(reads) : 0.0;
  r.reads_in_flight = loaders * plan.reads_in_flight();
  r.copy_gb_per_s = measure_copy(total_expert_bytes / layers.size());
  *out = r;
  return MOELITE_OK;
}

}  // namespace moelite
