// What the storage delivers to reads shaped like the expert store's, so that a storage bound is
// computed from the speed those reads can reach rather than from large sequential reads: each
// expert read as the store reads it (core/experts/expert_reads.h: three reads from the model file,
// widened to blocks where it opens with O_DIRECT, or one or three from a packed expert file), as
// many experts in one submission as a loader takes, and every loader thread with its own
// submission in flight -- through the store's own reader (io_uring or pread). The experts are
// random ones of random layers (a fixed seed: the same file gives the same reads).
#pragma once
#include <cstdint>

#include "base/status.h"

namespace moelite {

struct Model;

struct ExpertReadProbe {
  double gb_per_s = 0.0;        // bytes landed per second of wall time, every loader together
  double reads_per_s = 0.0;     // read requests completed per second
  double read_bytes = 0.0;      // mean bytes per read request, as issued
  int32_t reads_in_flight = 0;  // the most at once: loaders x reads per submission
  double copy_gb_per_s = 0.0;   // copying an expert's bytes once in DRAM (what a landing costs
                                // where a copy follows the read: buffered reads, a device upload)
};

// Reads about `bytes` (at least one submission per loader) of `model`'s routed experts with
// `loaders` threads. `model` may be inspected (moelite_model_inspect) or loaded; nothing of it
// changes. MOELITE_ERR_INVALID_ARGUMENT for a model without routed experts or loaders < 1,
// MOELITE_ERR_IO when a read fails, MOELITE_ERR_OUT_OF_MEMORY for the buffers.
Status probe_expert_reads(const Model& model, int32_t loaders, uint64_t bytes, ExpertReadProbe* out);

}  // namespace moelite
