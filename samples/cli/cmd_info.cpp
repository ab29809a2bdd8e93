#include <cinttypes>
#include <cstdio>

#include "cli.h"

namespace cli {

namespace {
const Command kInfoCommand = {"info", "-m MODEL [--json] [options]",
                              "The model's facts: architecture, experts, bytes, backend.",
                              with_groups({{{"--json"}, "", "print JSON"}}, {&model_options()})};
}  // namespace

int cmd_info(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kInfoCommand, &args, &rc)) return rc;
  std::string err;
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
      {"n_params", MOELITE_MODEL_N_PARAMS},
      {"n_active_params", MOELITE_MODEL_N_ACTIVE_PARAMS},
      {"expert_bytes", MOELITE_MODEL_EXPERT_BYTES},
      {"dense_bytes", MOELITE_MODEL_DENSE_BYTES},
      {"active_bytes_per_token", MOELITE_MODEL_ACTIVE_BYTES},
      {"threads", MOELITE_MODEL_THREADS},
      {"expert_budget", MOELITE_MODEL_EXPERT_BUDGET},  // 0: every expert resident
      {"expert_pool_bytes", MOELITE_MODEL_EXPERT_POOL_BYTES},
  };
  if (args.has("--json")) {
    printf("{\"arch\": \"%s\", \"name\": \"%s\", \"expert_type\": \"%s\", \"backend\": \"%s\"",
           json_escape(moelite_model_arch(model)).c_str(), json_escape(moelite_model_name(model)).c_str(),
           moelite_model_expert_type(model), json_escape(moelite_model_backend_name(model)).c_str());
    for (const Row& r : rows) printf(", \"%s\": %" PRId64, r.key, moelite_model_get(model, r.id));
    printf("}\n");
  } else {
    printf("%-24s %s\n%-24s %s\n%-24s %s\n%-24s %s\n", "arch", moelite_model_arch(model), "name",
           moelite_model_name(model), "expert_type", moelite_model_expert_type(model), "backend",
           moelite_model_backend_name(model));
    for (const Row& r : rows) printf("%-24s %" PRId64 "\n", r.key, moelite_model_get(model, r.id));
  }
  moelite_model_free(model);
  return 0;
}

}  // namespace cli
