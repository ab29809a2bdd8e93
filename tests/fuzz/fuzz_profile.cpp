// Calibration profiles: PROFILE.json and its weights sidecar PROFILE.json.bin. The input is the
// JSON, optionally followed by "\n#BIN\n" and the sidecar's bytes; a JSON naming "weights_file":
// "p.bin" reads the sidecar. A profile that loads is checked against its own model dimensions and
// saved again; the saved copy must load (the writer and the reader agree on every accepted file).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/model/model.h"
#include "core/model/profile.h"
#include "tests/fuzz/fuzz_common.h"

using namespace moelite_fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  quiet_logs();
  static const std::string dir = [] {
    std::string d = scratch_path("profile");
    std::string cmd = "mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find("\n#BIN\n");
  const std::string json = in.substr(0, cut);
  const std::string bin = cut == std::string::npos ? std::string() : in.substr(cut + 6);
  const std::string path = dir + "/p", bin_path = dir + "/p.bin";
  if (!write_file(path, reinterpret_cast<const uint8_t*>(json.data()), json.size())) return 0;
  if (cut == std::string::npos) {
    std::remove(bin_path.c_str());
  } else if (!write_file(bin_path, reinterpret_cast<const uint8_t*>(bin.data()), bin.size())) {
    return 0;
  }
  moelite::Profile p;
  if (moelite::Profile::load(path, &p) != MOELITE_OK) return 0;
  moelite::HParams hp;
  hp.arch = p.arch;
  hp.n_layer = p.n_layer;
  hp.n_expert = p.n_expert;
  hp.n_expert_used = p.n_expert_used;
  hp.n_embd = p.n_embd;
  if (p.check_model(hp) != MOELITE_OK) std::abort();
  const std::string again = dir + "/again";
  if (p.save(again) != MOELITE_OK) return 0;
  moelite::Profile q;
  if (moelite::Profile::load(again, &q) != MOELITE_OK) {
    std::fprintf(stderr, "a saved profile does not load: %s\n", moelite_last_error());
    std::abort();
  }
  return 0;
}
