#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <vector>

#include "cli.h"

namespace cli {

namespace {
const Command kInfoCommand = {
    "info", "-m MODEL [--json] [options] | --platform [-m MODEL] [--json]",
    "The model's facts: architecture, experts, bytes, backend, budget. --platform: the machine's facts (no model "
    "needed): board, cores, memory, cgroup, backends, storage read speed.",
    with_groups({{{"--json"}, "", "print JSON"},
                 {{"--platform"}, "", "describe this machine instead (storage measured where -m MODEL lies, else .)"}},
                {&model_options()})};

// Bytes the storage probe reads (twice): small enough to stay under about 2 s on SD cards.
constexpr size_t kStorageProbeBytes = size_t{32} << 20;

// Prints our own JSON (moelite_platform_describe_json: objects, arrays, strings, numbers, booleans)
// as "path  value" lines; arrays of scalars on one line.
void print_flat(const std::string& j) {
  size_t i = 0;
  std::vector<std::string> path;
  std::string key, line;
  auto scalar = [&]() -> std::string {
    std::string v;
    if (j[i] == '"') {
      for (++i; i < j.size() && j[i] != '"'; ++i) {
        if (j[i] == '\\' && i + 1 < j.size()) ++i;
        v += j[i];
      }
      ++i;
    } else {
      while (i < j.size() && j[i] != ',' && j[i] != '}' && j[i] != ']') v += j[i++];
    }
    return v;
  };
  auto name = [&]() {
    std::string n;
    for (const std::string& p : path) n += p + ".";
    return n + key;
  };
  while (i < j.size()) {
    const char c = j[i];
    if (c == ' ' || c == ',' || c == ':') {
      ++i;
    } else if (c == '{') {
      if (!key.empty()) path.push_back(key);
      key.clear();
      ++i;
    } else if (c == '}') {
      if (!path.empty()) path.pop_back();
      ++i;
    } else if (c == '[') {
      std::string items;
      for (++i; i < j.size() && j[i] != ']';) {
        if (j[i] == ' ' || j[i] == ',') { ++i; continue; }
        items += (items.empty() ? "" : " ") + scalar();
      }
      ++i;
      printf("%-28s %s\n", name().c_str(), items.empty() ? "-" : items.c_str());
      key.clear();
    } else if (key.empty() && c == '"') {
      key = scalar();
    } else {
      const std::string v = scalar();
      printf("%-28s %s\n", name().c_str(), v.empty() ? "-" : v.c_str());
      key.clear();
    }
  }
}

int platform_info(const Args& args) {
  size_t needed = 0;
  moelite_status st = moelite_platform_describe_json(nullptr, 0, &needed);
  std::string text;
  for (int attempt = 0; st == MOELITE_ERR_BUFFER_TOO_SMALL && attempt < 4; ++attempt) {
    text.assign(needed + 256, '\0');  // slack: memory figures may grow a digit between the calls
    st = moelite_platform_describe_json(&text[0], text.size(), &needed);
  }
  if (st != MOELITE_OK) return report(st, "describing the platform");
  text.resize(needed - 1);

  // Storage: the model file itself when given (what the expert store will read), else a scratch
  // file in the current directory.
  const std::string model = args.has("-m") ? args.get("-m") : args.get("--model");
  struct stat sb;
  if (!model.empty() && stat(model.c_str(), &sb) != 0) return usage_error("cannot open '" + model + "'");
  const std::string where = model.empty() ? "." : model;
  const double gbs = model.empty() ? measure_directory_storage_bandwidth(".", kStorageProbeBytes, 2)
                                   : measure_storage_bandwidth(model, kStorageProbeBytes, 2);
  char extra[512];
  snprintf(extra, sizeof extra, ", \"storage\": {\"path\": \"%s\", \"read_gb_s\": %.3f, \"probe_bytes\": %zu}}",
           json_escape(where).c_str(), gbs, kStorageProbeBytes);
  text.pop_back();  // the closing brace
  text += extra;
  if (args.has("--json"))
    printf("%s\n", text.c_str());
  else
    print_flat(text);
  return 0;
}
}  // namespace

int cmd_info(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kInfoCommand, &args, &rc)) return rc;
  if (args.has("--platform")) return platform_info(args);
  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  struct Row {
    const char* key;
    moelite_model_key id;
  } rows[] = {
      {"n_layers", MOELITE_MODEL_N_LAYERS},
      {"n_experts", MOELITE_MODEL_N_EXPERTS},
      {"n_experts_used", MOELITE_MODEL_N_EXPERTS_USED},
      {"n_shared_experts", MOELITE_MODEL_N_SHARED_EXPERTS},
      {"n_vocab", MOELITE_MODEL_N_VOCAB},
      {"n_embd", MOELITE_MODEL_N_EMBD},
      {"n_head", MOELITE_MODEL_N_HEAD},
      {"n_head_kv", MOELITE_MODEL_N_HEAD_KV},
      {"head_dim", MOELITE_MODEL_HEAD_DIM},
      {"n_ff_expert", MOELITE_MODEL_N_FF_EXPERT},
      {"n_ff_shared", MOELITE_MODEL_N_FF_SHARED},
      {"n_ctx_train", MOELITE_MODEL_N_CTX_TRAIN},
      {"sliding_window", MOELITE_MODEL_SLIDING_WINDOW},  // 0: every layer attends to everything
      {"n_windowed_layers", MOELITE_MODEL_N_WINDOWED_LAYERS},
      {"n_dense_layers", MOELITE_MODEL_N_DENSE_LAYERS},  // leading layers without experts
      {"kv_bytes_per_token", MOELITE_MODEL_KV_BYTES_PER_TOKEN},
      {"n_params", MOELITE_MODEL_N_PARAMS},
      {"n_active_params", MOELITE_MODEL_N_ACTIVE_PARAMS},
      {"expert_bytes", MOELITE_MODEL_EXPERT_BYTES},
      {"dense_bytes", MOELITE_MODEL_DENSE_BYTES},
      {"active_bytes_per_token", MOELITE_MODEL_ACTIVE_BYTES},
      {"threads", MOELITE_MODEL_THREADS},
      {"expert_budget", MOELITE_MODEL_EXPERT_BUDGET},  // 0: every expert resident
      {"expert_pool_bytes", MOELITE_MODEL_EXPERT_POOL_BYTES},
      {"expert_slots", MOELITE_MODEL_EXPERT_SLOTS},
      {"expert_min_budget", MOELITE_MODEL_EXPERT_MIN_BUDGET},
      {"experts_all_fit", MOELITE_MODEL_EXPERTS_ALL_FIT},
      {"budget_auto", MOELITE_MODEL_BUDGET_AUTO},
      {"budget_auto_available", MOELITE_MODEL_BUDGET_AUTO_ROOM},
      {"budget_auto_context_bytes", MOELITE_MODEL_BUDGET_AUTO_CONTEXT_BYTES},
      {"budget_auto_headroom", MOELITE_MODEL_BUDGET_AUTO_HEADROOM},
  };
  if (args.has("--json")) {
    printf("{\"arch\": \"%s\", \"name\": \"%s\", \"expert_type\": \"%s\", \"backend\": \"%s\"",
           json_escape(moelite_model_arch(model)).c_str(), json_escape(moelite_model_name(model)).c_str(),
           moelite_model_expert_type(model), json_escape(moelite_model_backend_name(model)).c_str());
    for (const Row& r : rows) printf(", \"%s\": %" PRId64, r.key, moelite_model_get(model, r.id));
    printf(", \"budget_summary\": \"%s\", \"expert_file\": \"%s\"}\n", json_escape(budget_summary(model)).c_str(),
           json_escape(moelite_model_expert_file(model)).c_str());
  } else {
    printf("%-26s %s\n%-26s %s\n%-26s %s\n%-26s %s\n", "arch", moelite_model_arch(model), "name",
           moelite_model_name(model), "expert_type", moelite_model_expert_type(model), "backend",
           moelite_model_backend_name(model));
    for (const Row& r : rows) printf("%-26s %" PRId64 "\n", r.key, moelite_model_get(model, r.id));
    printf("%-26s %s\n", "budget", budget_summary(model).c_str());
    printf("%-26s %s\n", "expert_file", moelite_model_expert_file(model));
  }
  free_model(model);
  return 0;
}

}  // namespace cli
