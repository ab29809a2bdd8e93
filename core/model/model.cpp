#include "core/model/model.h"

#include <algorithm>
#include <cinttypes>
#include <cstdlib>

#include "core/model/arch/arch.h"
#include "core/model/load_checks.h"
#include "core/model/tensor_binder.h"
#include "platforms/system_info.h"

namespace moelite {

ExpertWeights LayerExperts::expert(int32_t e) const {
  if (!split.empty()) return split[static_cast<size_t>(e)];
  ExpertWeights w{gate, up, down};
  const uint64_t i = static_cast<uint64_t>(e);
  if (!gate_bias.empty()) w.gate_bias = gate_bias.data() + i * static_cast<uint64_t>(gate.rows);
  if (!up_bias.empty()) w.up_bias = up_bias.data() + i * static_cast<uint64_t>(up.rows);
  if (!down_bias.empty()) w.down_bias = down_bias.data() + i * static_cast<uint64_t>(down.rows);
  w.gate.file_offset += gate_stride * i;
  w.up.file_offset += up_stride * i;
  w.down.file_offset += down_stride * i;
  if (w.gate.data) w.gate.data += gate_stride * i;
  if (w.up.data) w.up.data += up_stride * i;
  if (w.down.data) w.down.data += down_stride * i;
  return w;
}

Model::~Model() {
  for (void* p : owned) platform::aligned_free(p);
}

namespace {

// By shape, not by data: an expert bound lazily (a budgeted or inspecting load) has no data yet but
// the same parameters, so n_params and n_active_params are facts of the file whatever the budget.
uint64_t params_of(const WeightView& w) {
  return w.rows > 0 && w.cols > 0 ? static_cast<uint64_t>(w.rows) * static_cast<uint64_t>(w.cols) : 0;
}

Status report_progress(const LoadOptions& o, float p) {
  if (o.progress && !o.progress(p, o.progress_user))
    return fail(MOELITE_ERR_PROGRESS_ABORTED, "model loading cancelled by the progress callback");
  return MOELITE_OK;
}

// The embeddings, the output norm and head (with phimoe's biases), LongRoPE's factors; a model
// without an output head ties it to the embeddings.
Status bind_global_tensors(const ArchDescriptor& arch, TensorBinder& b, Model* m) {
  const gguf::Reader& g = *m->gguf;
  HParams& hp = m->hp;
  const gguf::TensorInfo* emb = g.find_tensor("token_embd.weight");
  if (!emb) return fail(MOELITE_ERR_MISSING_TENSOR, "tensor 'token_embd.weight' is absent");
  if (emb->ne[1] < 1 || emb->ne[1] > MOELITE_MAX_VOCAB)
    return fail(MOELITE_ERR_BAD_SHAPE, "token_embd.weight has a vocabulary of %" PRId64 " tokens, outside [1, %d]",
                emb->ne[1], MOELITE_MAX_VOCAB);
  hp.n_vocab = static_cast<int32_t>(emb->ne[1]);
  MOELITE_TRY(b.matrix("token_embd.weight", hp.n_embd, hp.n_vocab, &m->tok_embd));
  MOELITE_TRY(b.floats("output_norm.weight", hp.n_embd, &m->output_norm));
  MOELITE_TRY(b.matrix("output.weight", hp.n_embd, hp.n_vocab, &m->output, false));
  // Biases of the output norm and head (phimoe's); optional everywhere.
  MOELITE_TRY(b.floats("output_norm.bias", hp.n_embd, &m->output_norm_b, false));
  MOELITE_TRY(b.floats("output.bias", hp.n_vocab, &m->output_b, false));
  if (arch.rope_factors) {
    MOELITE_TRY(b.floats("rope_factors_long.weight", hp.n_rot / 2, &hp.rope_factors_long, false));
    MOELITE_TRY(b.floats("rope_factors_short.weight", hp.n_rot / 2, &hp.rope_factors_short, false));
    for (const std::vector<float>* f : {&hp.rope_factors_long, &hp.rope_factors_short})
      for (float v : *f)
        if (!(v > 0.0f && v < 1e30f))
          return fail(MOELITE_ERR_BAD_METADATA, "a LongRoPE factor (%g) is not a positive number",
                      static_cast<double>(v));
  }
  if (!m->output.valid()) m->output = m->tok_embd;  // tied embeddings
  return MOELITE_OK;
}

// Routed-expert bytes vs everything else (of the `bound_bytes` bound), the parameters, and what one
// token reads: counted by shape, whether the experts' bytes are mapped, read or left for the store.
void count_sizes(const gguf::Reader& g, uint64_t bound_bytes, Model* m) {
  const HParams& hp = m->hp;
  uint64_t type_bytes[kTensorTypeIdLimit] = {};
  for (const LayerWeights& lw : m->layers) {
    if (!lw.experts.present()) continue;  // a leading dense block
    for (int32_t e = 0; e < hp.n_expert; ++e) {
      ExpertWeights ew = lw.experts.expert(e);
      for (const WeightView* v : {&ew.gate, &ew.up, &ew.down}) {
        const uint64_t bytes = v->row_bytes * static_cast<uint64_t>(v->rows);
        m->expert_bytes += bytes;
        type_bytes[static_cast<uint32_t>(v->type)] += bytes;
        m->n_params += params_of(*v);
        if (e < hp.n_expert_used) m->n_active_params += params_of(*v);
      }
    }
  }
  for (uint32_t t = 0; t < kTensorTypeIdLimit; ++t)
    if (type_bytes[t] > type_bytes[static_cast<uint32_t>(m->expert_type)]) m->expert_type = static_cast<TensorType>(t);
  m->dense_bytes = bound_bytes - m->expert_bytes;
  {
    const uint64_t embd_bytes = m->tok_embd.row_bytes * static_cast<uint64_t>(m->tok_embd.rows);
    const bool tied = m->output.data == m->tok_embd.data;
    m->active_bytes = m->dense_bytes - (tied ? 0 : embd_bytes) + m->tok_embd.row_bytes +
                      m->expert_bytes / static_cast<uint64_t>(hp.n_expert) * static_cast<uint64_t>(hp.n_expert_used);
  }
  uint64_t total_params = 0;
  for (const gguf::TensorInfo& t : g.tensors()) total_params += t.n_elements;
  const uint64_t dense_params = total_params - m->n_params;
  m->n_params = total_params;
  m->n_active_params += dense_params;
}

}  // namespace

Status Model::load(const std::string& path, const LoadOptions& opts, std::unique_ptr<Model>* out) {
  auto m = std::make_unique<Model>();
  m->path = path;
  // Inspection binds like a budgeted load (experts lazy) but maps the file instead of reading the
  // dense weights, so nothing is read beyond the header and a few small norm vectors.
  const bool budgeted = !opts.inspect_only && opts.stream_experts;
  m->inspect_only = opts.inspect_only;
  if (budgeted) m->memory_room_at_load = platform::read_memory_info().room_bytes();
  MOELITE_TRY(gguf::Reader::open(path, &m->gguf));
  const gguf::Reader& g = *m->gguf;

  // Tokenizer and chat template: optional for computing logits, required for text.
  if (g.find("tokenizer.ggml.model")) MOELITE_TRY(Tokenizer::from_gguf(g, &m->tokenizer));
  std::string chat_src;
  if (g.get_string("tokenizer.chat_template", &chat_src)) m->chat_template = detect_chat_template(chat_src);
  if (!opts.chat_template.empty()) {
    MOELITE_TRY(chat_template_from_option(opts.chat_template, &m->chat_template));
    m->chat_template_chosen = true;
  }
  if (opts.vocab_only) {
    if (!m->tokenizer)
      return fail(MOELITE_ERR_MISSING_METADATA, "'%s' has no tokenizer (tokenizer.ggml.model)", path.c_str());
    m->vocab_only = true;
    g.get_string("general.architecture", &m->hp.arch);
    g.get_string("general.name", &m->hp.name);
    m->hp.n_vocab = m->tokenizer->n_tokens();
    MOELITE_TRY(report_progress(opts, 1.0f));
    *out = std::move(m);
    return MOELITE_OK;
  }

  std::string arch_name;
  if (!g.find("general.architecture"))
    return fail(MOELITE_ERR_MISSING_METADATA, "'%s' has no general.architecture key", path.c_str());
  if (!g.get_string("general.architecture", &arch_name))
    return fail(MOELITE_ERR_MISSING_METADATA, "general.architecture must be a string");
  m->arch = find_arch(arch_name);
  if (!m->arch)
    return fail(MOELITE_ERR_UNSUPPORTED_ARCH, "architecture '%s' is not supported; supported: %s", arch_name.c_str(),
                supported_arch_list());
  m->hp.arch = arch_name;
  if (arch_name == "llama" && !g.find("llama.expert_count"))
    return fail(MOELITE_ERR_UNSUPPORTED_ARCH,
                "this 'llama' model has no experts (llama.expert_count); "
                "moelite runs Mixture-of-Experts models only");
  const ArchDescriptor& arch = *m->arch;
  m->expert_ffn.activation = arch.expert_activation;
  MOELITE_TRY((arch.read_hparams ? arch.read_hparams : standard_read_hparams)(g, arch, &m->hp));
  MOELITE_TRY(check_block_count(g, m->hp));
  MOELITE_TRY(report_progress(opts, 0.0f));

  // With a budget the file is not mapped at all: the store reads experts with pread/io_uring, and
  // the dense weights are read into memory, so a file that shrinks under a running model gives
  // MOELITE_ERR_IO from those reads instead of SIGBUS from a mapped page (include/moelite.h).
  if ((opts.use_mmap || opts.inspect_only) && !budgeted) MOELITE_TRY(platform::Mapping::map(g.file(), &m->mapping));

  // Global tensors.
  TensorBinder b(*m);
  b.set_lazy_experts(budgeted || opts.inspect_only);
  MOELITE_TRY(bind_global_tensors(arch, b, m.get()));
  HParams& hp = m->hp;
  MOELITE_TRY(check_vocabulary(g, *m));

  // Layers.
  m->layers.resize(static_cast<size_t>(hp.n_layer));
  for (int32_t l = 0; l < hp.n_layer; ++l) {
    MOELITE_TRY(
        (arch.bind_layer ? arch.bind_layer : standard_bind_layer)(b, arch, hp, l, &m->layers[static_cast<size_t>(l)]));
    MOELITE_TRY(report_progress(opts, 0.95f * static_cast<float>(l + 1) / static_cast<float>(hp.n_layer)));
  }
  MOELITE_TRY(check_expert_widths(*m));
  const LayerWeights& first_moe = m->layers[static_cast<size_t>(hp.n_dense_lead)];
  if (hp.n_ff_expert == 0) {
    const LayerExperts& e0 = first_moe.experts;
    hp.n_ff_expert = static_cast<int32_t>(e0.split.empty() ? e0.gate.rows : e0.split[0].gate.rows);
  }
  if (hp.n_ff_shared == 0 && first_moe.has_shared) hp.n_ff_shared = static_cast<int32_t>(first_moe.shared.gate.rows);

  count_sizes(g, b.bound_bytes(), m.get());
  if (budgeted || opts.inspect_only) attach_packed_experts(m.get());
  MOELITE_TRY(report_progress(opts, 1.0f));
  log_msg(MOELITE_LOG_INFO, "loaded %s '%s': %d layers, %d experts (top-%d), %.1f MiB experts + %.1f MiB dense",
          hp.arch.c_str(), hp.name.c_str(), hp.n_layer, hp.n_expert, hp.n_expert_used, m->expert_bytes / 1048576.0,
          m->dense_bytes / 1048576.0);
  *out = std::move(m);
  return MOELITE_OK;
}

}  // namespace moelite
