// Saved sessions (moelite_context_load) into a context of the shipped model: 2 sequences of 32
// positions. The first byte picks the mode. Even: the rest is a session's payload, wrapped in a
// header with this model's fingerprint, the right sizes and checksum, so the fuzzer explores what
// lies behind the checksum (the cache shape, sequences, tokens, each layer's rows). Odd: the rest
// is the whole file as is (header checks, zstd frames, sizes). A session that loads must leave
// sequences the context can hold, take a token, and save again into a file that loads too; any
// status but MOELITE_ERR_INTERNAL is an answer.
#include <cstring>
#include <string>
#include <vector>

#include "base/hash.h"
#include "tests/fuzz/fuzz_common.h"

using namespace moelite_fuzz;

namespace {

constexpr int32_t kSequences = 2, kPositions = 32;

struct Fixture {
  moelite_model* model = nullptr;
  moelite_context* ctx = nullptr;
  uint64_t fingerprint = 0;
  std::string dir;
};

Fixture& fixture() {
  static Fixture f = [] {
    Fixture x;
    x.model = load_shipped_model(/*vocab_only=*/false);
    moelite_context_params* cp = moelite_context_params_create();
    moelite_context_params_set_n_ctx(cp, kPositions);
    moelite_context_params_set_n_seq(cp, kSequences);
    moelite_context_params_set_n_batch(cp, 8);
    if (moelite_context_create(x.model, cp, &x.ctx) != MOELITE_OK) std::abort();
    moelite_context_params_free(cp);
    x.dir = scratch_path("session");
    // The fingerprint: what a session saved by this context carries at byte 16 of its header.
    const int32_t toks[3] = {1, 2, 3};
    const std::string probe = x.dir + ".probe";
    if (moelite_eval(x.ctx, toks, 3, 0) != MOELITE_OK || moelite_context_save(x.ctx, probe.c_str()) != MOELITE_OK)
      std::abort();
    FILE* fp = std::fopen(probe.c_str(), "rb");
    uint8_t header[24];
    if (!fp || std::fread(header, 1, sizeof header, fp) != sizeof header) std::abort();
    std::fclose(fp);
    std::remove(probe.c_str());
    memcpy(&x.fingerprint, header + 16, 8);
    return x;
  }();
  return f;
}

// The file layout of core/exec/session.cpp: magic, version 1, stored (0), fingerprint, payload bytes,
// stored bytes, payload checksum, then the payload.
std::vector<uint8_t> wrap(const uint8_t* payload, size_t n, uint64_t fingerprint) {
  std::vector<uint8_t> file(48 + n);
  const uint32_t version = 1, stored = 0;
  const uint64_t bytes = n, checksum = moelite::hash_bytes(payload, n);
  memcpy(file.data(), "MOELSESS", 8);
  memcpy(file.data() + 8, &version, 4);
  memcpy(file.data() + 12, &stored, 4);
  memcpy(file.data() + 16, &fingerprint, 8);
  memcpy(file.data() + 24, &bytes, 8);
  memcpy(file.data() + 32, &bytes, 8);
  memcpy(file.data() + 40, &checksum, 8);
  if (n) memcpy(file.data() + 48, payload, n);
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  quiet_logs();
  if (size == 0) return 0;
  Fixture& f = fixture();
  const std::string path = f.dir, again = f.dir + ".again";
  std::vector<uint8_t> file =
      (data[0] & 1) ? std::vector<uint8_t>(data + 1, data + size) : wrap(data + 1, size - 1, f.fingerprint);
  if (!write_file(path, file.data(), file.size())) return 0;
  const moelite_status st = moelite_context_load(f.ctx, path.c_str());
  check(st, "context_load");
  if (st != MOELITE_OK) return 0;
  for (int32_t s = 0; s < kSequences; ++s)
    if (moelite_context_seq_length(f.ctx, s) > kPositions) {
      std::fprintf(stderr, "sequence %d holds %d positions after load, the context %d\n", s,
                   moelite_context_seq_length(f.ctx, s), kPositions);
      std::abort();
    }
  // The restored state is usable: a token after sequence 0's, then a save that loads again.
  const int32_t tok = 5;
  if (moelite_context_seq_length(f.ctx, 0) < kPositions) check(moelite_eval(f.ctx, &tok, 1, 1), "eval after load");
  if (moelite_context_save(f.ctx, again.c_str()) != MOELITE_OK) return 0;
  if (moelite_context_load(f.ctx, again.c_str()) != MOELITE_OK) {
    std::fprintf(stderr, "a session saved after a load does not load: %s\n", moelite_last_error());
    std::abort();
  }
  return 0;
}
