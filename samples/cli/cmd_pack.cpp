#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"

namespace cli {

namespace {
const Command kPackCommand = {
    "pack", "-m MODEL [-o OUT] [--json]",
    "Writes the packed expert file beside the model (MODEL.experts; moelite_pack_experts): every expert's gate, "
    "up and down in one 4 KiB-aligned record, so a budget reads an expert in one request. The model file is not "
    "changed. Then reports what zstd would save per weight type on a sample of the experts.",
    {{{"-m", "--model"}, "MODEL", "the GGUF model (required)"},
     {{"-o"}, "OUT", "where to write (default MODEL.experts, where loads look for it)"},
     {{"--zstd-sample"}, "N", "experts compressed for the zstd report (default 64; 0: no report)"},
     {{"--json"}, "", "print JSON"}}};
}  // namespace

int cmd_pack(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kPackCommand, &args, &rc)) return rc;
  const std::string model_path = args.has("-m") ? args.get("-m") : args.get("--model");
  if (model_path.empty()) return usage_error("missing -m MODEL");
  const std::string out = args.has("-o") ? args.get("-o") : model_path + ".experts";
  std::string err;
  int64_t sample = 64;
  if (!args.get_int("--zstd-sample", 64, &sample, &err)) return usage_error(err);
  if (sample < 0 || sample > 1000000) return usage_error("--zstd-sample must be 0..1000000");
  const bool json = args.has("--json");
  const bool bar = !json && isatty(STDERR_FILENO);
  moelite_status st = moelite_pack_experts(model_path.c_str(), out.c_str(), bar ? progress_bar : nullptr, nullptr);
  if (st != MOELITE_OK) return report(st, "packing experts");
  struct stat sb;
  const uint64_t bytes = stat(out.c_str(), &sb) == 0 ? static_cast<uint64_t>(sb.st_size) : 0;

  std::vector<moelite_expert_compression> rows(8);
  int32_t n_rows = 0;
  if (sample > 0) {
    moelite_model* model = nullptr;
    st = moelite_model_inspect(model_path.c_str(), &model);
    if (st != MOELITE_OK) return report(st, "inspecting the model");
    st = moelite_model_measure_expert_compression(model, 3, static_cast<int32_t>(sample), rows.data(),
                                                  static_cast<int32_t>(rows.size()), &n_rows);
    moelite_model_free(model);
    if (st == MOELITE_ERR_NOT_IMPLEMENTED) {
      if (!json) fprintf(stderr, "moelite: no zstd report: %s\n", moelite_last_error());
      n_rows = 0;
    } else if (st != MOELITE_OK) {
      return report(st, "measuring compression");
    }
  }
  rows.resize(static_cast<size_t>(n_rows));
  if (json) {
    printf("{\"packed\": \"%s\", \"bytes\": %" PRIu64 ", \"zstd\": [", json_escape(out).c_str(), bytes);
    for (size_t i = 0; i < rows.size(); ++i)
      printf("%s{\"type\": \"%s\", \"matrices\": %" PRId64 ", \"raw_bytes\": %" PRIu64 ", \"zstd_bytes\": %" PRIu64
             ", \"ratio\": %.4f, \"decompress_gb_s\": %.3f}",
             i ? ", " : "", rows[i].weight_type, rows[i].matrices, rows[i].raw_bytes, rows[i].zstd_bytes,
             rows[i].zstd_bytes ? double(rows[i].raw_bytes) / double(rows[i].zstd_bytes) : 0.0,
             rows[i].decompress_gb_per_s);
    printf("]}\n");
    return 0;
  }
  printf("wrote %s (%.1f MiB): a budgeted load of %s reads its experts from it\n", out.c_str(), bytes / 1048576.0,
         model_path.c_str());
  if (!rows.empty()) {
    printf("zstd level 3 on %" PRId64 " sampled matrices:\n", rows[0].matrices);
    printf("%-8s %9s %12s %12s %7s %16s\n", "type", "matrices", "raw MB", "zstd MB", "ratio", "decompress GB/s");
    for (const moelite_expert_compression& r : rows)
      printf("%-8s %9" PRId64 " %12.2f %12.2f %7.3f %16.2f\n", r.weight_type, r.matrices, r.raw_bytes / 1e6,
             r.zstd_bytes / 1e6, r.zstd_bytes ? double(r.raw_bytes) / double(r.zstd_bytes) : 0.0, r.decompress_gb_per_s);
  }
  return 0;
}

}  // namespace cli
