'use strict';
// The C API through koffi: the library, its types and the functions this binding calls. Loaded
// once, on first use. Which file: MOELITE_LIBRARY, else the repository's build tree
// (build/lib/libmoelite.so beside bindings/), else the system's libmoelite.so.0.
const fs = require('node:fs');
const path = require('node:path');
const koffi = require('koffi');

// The files to try, in order, each with where it came from.
function candidates() {
  if (process.env.MOELITE_LIBRARY) return [['MOELITE_LIBRARY', process.env.MOELITE_LIBRARY]];  // final
  const tree = path.join(__dirname, '..', '..', '..', 'build', 'lib', 'libmoelite.so');
  return [['source checkout build tree', tree], ['system library path', 'libmoelite.so.0']];
}

// Opens the first candidate that loads; an Error listing every try and the way to choose one.
function openLibrary() {
  const tried = [];
  for (const [how, file] of candidates()) {
    if (file.includes(path.sep) && !fs.existsSync(file)) {
      tried.push(`${how}: ${file} (does not exist)`);
      continue;
    }
    try {
      return koffi.load(file);
    } catch (e) {
      tried.push(`${how}: ${file} (${e.message})`);
    }
  }
  throw new Error('moelite: cannot load the moelite shared library (libmoelite.so). Set MOELITE_LIBRARY to its ' +
                  'full path (build/lib/libmoelite.so of a build, PREFIX/lib/libmoelite.so of an install), or install ' +
                  'it where the dynamic loader looks (ldconfig). Tried, in order:\n  ' + tried.join('\n  '));
}

let api = null;

function load() {
  if (api) return api;
  const lib = openLibrary();
  koffi.opaque('moelite_model');
  koffi.opaque('moelite_model_params');
  koffi.opaque('moelite_context');
  koffi.opaque('moelite_context_params');
  koffi.opaque('moelite_generate_params');
  koffi.opaque('moelite_sampler');
  koffi.opaque('moelite_queue');
  koffi.struct('moelite_expert_stats', {
    struct_size: 'size_t',
    activations: 'uint64_t',
    hits: 'uint64_t',
    misses: 'uint64_t',
    prefetches_issued: 'uint64_t',
    prefetches_used: 'uint64_t',
    prefetches_wasted: 'uint64_t',
    bytes_read: 'uint64_t',
    wait_seconds: 'double',
    predicted: 'uint64_t',
    predictions: 'uint64_t',
    ready_when_needed: 'uint64_t',
    routed_tokens: 'uint64_t',
    routed_experts: 'uint64_t',
    read_busy_seconds: 'double',
    reads: 'uint64_t',
  });
  koffi.struct('moelite_generate_stats', {
    struct_size: 'size_t',
    n_prompt_tokens: 'int32_t',
    n_cached_tokens: 'int32_t',
    n_generated_tokens: 'int32_t',
    stop_reason: 'int32_t',
    prompt_seconds: 'double',
    generate_seconds: 'double',
    time_to_first_token_seconds: 'double',
    prompt_tokens_per_second: 'double',
    generated_tokens_per_second: 'double',
  });
  koffi.struct('moelite_quality_stats', {
    struct_size: 'size_t',
    gated_tokens: 'uint64_t',
    predicted_loss: 'double',
    metered_tokens: 'uint64_t',
    kl_mean: 'double',
    kl_stderr: 'double',
    top1_agreement: 'double',
    top1_stderr: 'double',
    predicted_loss_metered: 'double',
    meter_evaluations: 'uint64_t',
    meter_seconds: 'double',
    threshold: 'double',
    target_kl: 'double',
    kl_per_predicted: 'double',
  });
  koffi.struct('moelite_chat_message', { role: 'const char *', content: 'const char *' });
  const pieceFn = koffi.proto('int moelite_piece_fn(const void *piece, size_t len, void *user_data)');
  const decls = [
    'const char *moelite_version_string(void)',
    'const char *moelite_status_name(int status)',
    'const char *moelite_last_error(void)',
    'moelite_model_params *moelite_model_params_create(void)',
    'void moelite_model_params_free(moelite_model_params *p)',
    'int moelite_model_params_set_threads(moelite_model_params *p, int32_t threads)',
    'int moelite_model_params_set_backend(moelite_model_params *p, int backend)',
    'int moelite_model_params_set_expert_budget(moelite_model_params *p, uint64_t bytes)',
    'int moelite_model_params_set_expert_budget_fraction(moelite_model_params *p, double fraction)',
    'int moelite_model_params_set_expert_budget_auto(moelite_model_params *p, uint64_t headroom)',
    'int moelite_model_params_set_expert_budget_text(moelite_model_params *p, const char *text)',
    'int moelite_model_params_set_expert_policy(moelite_model_params *p, const char *policy)',
    'int moelite_model_params_set_predictor(moelite_model_params *p, const char *predictor)',
    'int moelite_model_params_set_cache_allocation(moelite_model_params *p, const char *allocation)',
    'int moelite_model_params_set_gating(moelite_model_params *p, const char *mode, float threshold)',
    'int moelite_model_params_set_gating_penalty(moelite_model_params *p, float penalty)',
    'int moelite_model_params_set_gating_substitutes(moelite_model_params *p, int32_t substitutes)',
    'int moelite_model_params_set_profile(moelite_model_params *p, const char *path)',
    'int moelite_model_load(const char *path, const moelite_model_params *p, _Out_ moelite_model **out)',
    'void moelite_model_free(moelite_model *m)',
    'int64_t moelite_model_get(const moelite_model *m, int key)',
    'const char *moelite_model_arch(const moelite_model *m)',
    'const char *moelite_model_name(const moelite_model *m)',
    'const char *moelite_model_backend_name(const moelite_model *m)',
    'int moelite_model_expert_stats(const moelite_model *m, int32_t layer, _Inout_ moelite_expert_stats *out)',
    'void moelite_model_reset_expert_stats(moelite_model *m)',
    'int moelite_model_trace_begin(moelite_model *m, const char *path)',
    'int moelite_model_trace_end(moelite_model *m)',
    'int moelite_tokenize(const moelite_model *m, const char *text, size_t len, uint32_t flags, _Out_ int32_t *tokens, int32_t capacity, _Out_ int32_t *n)',
    'int moelite_detokenize(const moelite_model *m, const int32_t *tokens, int32_t n, uint32_t flags, _Out_ uint8_t *text, size_t capacity, _Out_ size_t *len)',
    'int32_t moelite_token_is_end(const moelite_model *m, int32_t token)',
    'int moelite_chat_format(const moelite_model *m, const moelite_chat_message *msgs, size_t n, int32_t add_assistant, _Out_ uint8_t *text, size_t capacity, _Out_ size_t *len)',
    'int moelite_chat_tokenize(const moelite_model *m, const moelite_chat_message *msgs, size_t n, int32_t add_assistant, _Out_ int32_t *tokens, int32_t capacity, _Out_ int32_t *n_tokens)',
    'moelite_context_params *moelite_context_params_create(void)',
    'void moelite_context_params_free(moelite_context_params *p)',
    'int moelite_context_params_set_n_ctx(moelite_context_params *p, int32_t nCtx)',
    'int moelite_context_params_set_n_batch(moelite_context_params *p, int32_t nBatch)',
    'int moelite_context_params_set_n_seq(moelite_context_params *p, int32_t nSeq)',
    'int moelite_context_params_set_quality_meter(moelite_context_params *p, double qualitySample)',
    'int moelite_context_params_set_quality_target(moelite_context_params *p, const char *qualityTarget)',
    'int moelite_context_params_set_quality_bounds(moelite_context_params *p, double min, double max)',
    'int moelite_context_create(moelite_model *m, const moelite_context_params *p, _Out_ moelite_context **out)',
    'void moelite_context_free(moelite_context *c)',
    'int moelite_eval(moelite_context *c, const int32_t *tokens, int32_t n, int32_t logits_all)',
    'int moelite_eval_batch(moelite_context *c, const int32_t *tokens, const int32_t *seq_ids, const uint8_t *want, int32_t n)',
    'const float *moelite_get_logits(const moelite_context *c, int32_t i)',
    'int32_t moelite_context_kv_length(const moelite_context *c)',
    'int32_t moelite_context_n_ctx(const moelite_context *c)',
    'void moelite_context_kv_reset(moelite_context *c)',
    'void moelite_context_kv_truncate(moelite_context *c, int32_t n_keep)',
    'int32_t moelite_context_seq_length(const moelite_context *c, int32_t seq)',
    'int moelite_context_seq_truncate(moelite_context *c, int32_t seq, int32_t n_keep)',
    'int moelite_context_get_tokens(const moelite_context *c, _Out_ int32_t *tokens, int32_t capacity, _Out_ int32_t *n)',
    'int moelite_context_save(const moelite_context *c, const char *path)',
    'int moelite_context_load(moelite_context *c, const char *path)',
    'int moelite_context_expert_stats(const moelite_context *c, int32_t layer, _Inout_ moelite_expert_stats *out)',
    'void moelite_context_reset_expert_stats(moelite_context *c)',
    'int moelite_context_quality_stats(const moelite_context *c, _Inout_ moelite_quality_stats *out)',
    'moelite_generate_params *moelite_generate_params_create(void)',
    'void moelite_generate_params_free(moelite_generate_params *p)',
    'int moelite_generate_params_set_max_tokens(moelite_generate_params *p, int32_t maxTokens)',
    'int moelite_generate_params_set_temperature(moelite_generate_params *p, float t)',
    'int moelite_generate_params_set_top_k(moelite_generate_params *p, int32_t topK)',
    'int moelite_generate_params_set_top_p(moelite_generate_params *p, float v)',
    'int moelite_generate_params_set_min_p(moelite_generate_params *p, float v)',
    'int moelite_generate_params_set_repeat_penalty(moelite_generate_params *p, float penalty, int32_t repeatLastN)',
    'int moelite_generate_params_set_seed(moelite_generate_params *p, uint64_t seed)',
    'int moelite_generate_params_add_stop(moelite_generate_params *p, const char *stop)',
    'int moelite_generate_params_set_callback(moelite_generate_params *p, moelite_piece_fn *fn, void *user)',
    'int moelite_generate(moelite_context *c, const char *prompt, size_t len, const moelite_generate_params *p, _Inout_ moelite_generate_stats *stats)',
    'int moelite_sampler_create(const moelite_generate_params *p, _Out_ moelite_sampler **out)',
    'void moelite_sampler_free(moelite_sampler *s)',
    'int moelite_sampler_accept(moelite_sampler *s, const int32_t *tokens, int32_t n)',
    'int moelite_sampler_sample(moelite_sampler *s, const moelite_context *c, int32_t i, _Out_ int32_t *token)',
    'int moelite_queue_create(moelite_context *c, _Out_ moelite_queue **out)',
    'void moelite_queue_free(moelite_queue *q)',
    'int moelite_queue_add(moelite_queue *q, const int32_t *prompt, int32_t n, const moelite_generate_params *p, _Out_ int64_t *id)',
    'int moelite_queue_step(moelite_queue *q, _Out_ int32_t *n_events)',
    'int moelite_queue_event(const moelite_queue *q, int32_t i, _Out_ int64_t *id, _Out_ int32_t *token, _Out_ int32_t *state)',
    'int64_t moelite_queue_waiting(const moelite_queue *q)',
    'int64_t moelite_queue_running(const moelite_queue *q)',
    'int64_t moelite_queue_finished(const moelite_queue *q)',
    'int moelite_queue_request_state(const moelite_queue *q, int64_t id, _Out_ int32_t *state)',
    'int moelite_queue_request_stats(const moelite_queue *q, int64_t id, _Inout_ moelite_generate_stats *stats)',
    'int moelite_queue_request_tokens(const moelite_queue *q, int64_t id, _Out_ int32_t *tokens, int32_t capacity, _Out_ int32_t *n)',
    'int moelite_queue_request_text(const moelite_queue *q, int64_t id, _Out_ uint8_t *buf, size_t capacity, _Out_ size_t *len)',
    'int moelite_queue_cancel(moelite_queue *q, int64_t id)',
    'int moelite_queue_remove(moelite_queue *q, int64_t id)',
  ];
  const fns = {};
  for (const d of decls) {
    const name = d.match(/(moelite_\w+)\(/)[1];
    fns[name] = checked(name, d, lib.func(d));
  }
  api = { koffi, fns, pieceFn };
  return api;
}

// Integer parameter types -> [lowest, highest] (BigInt). koffi converts a JS number to a C integer
// by truncating and wrapping it (2 ** 32 + 1 becomes 1 as an int32_t, 64.7 becomes 64, NaN 0),
// and a string to a C string that ends at its first NUL; the checks below refuse both before the
// call (RangeError, TypeError), naming the function and the parameter.
const INT_RANGES = {
  int: [-(2n ** 31n), 2n ** 31n - 1n], int32_t: [-(2n ** 31n), 2n ** 31n - 1n], uint32_t: [0n, 2n ** 32n - 1n],
  int64_t: [-(2n ** 63n), 2n ** 63n - 1n], uint64_t: [0n, 2n ** 64n - 1n], size_t: [0n, 2n ** 64n - 1n],
};

function intChecker(fn, param, [low, high]) {
  return (v) => {
    let big;
    if (typeof v === 'bigint') big = v;
    else if (typeof v === 'number' && Number.isInteger(v)) big = BigInt(v);
    else if (typeof v === 'boolean') return;
    else {
      const E = typeof v === 'number' ? RangeError : TypeError;  // NaN, 1.5, Infinity: a number, not an integer
      throw new E(`${fn}: ${param} must be an integer, not ${typeof v === 'string' ? JSON.stringify(v) : String(v)}`);
    }
    if (big < low || big > high) throw new RangeError(`${fn}: ${param} is ${v}, outside ${low}..${high}`);
  };
}

function cStringChecker(fn, param) {
  return (v) => {
    if (typeof v === 'string' && v.includes('\0')) {
      const e = new TypeError(`${fn}: ${param} contains a NUL character, where the C string would end`);
      e.code = 'ERR_INVALID_ARG_VALUE';
      throw e;
    }
  };
}

// fn (and fn.async) with its integer and C-string parameters checked first (see INT_RANGES).
function checked(name, decl, fn) {
  const params = decl.slice(decl.indexOf('(') + 1, decl.lastIndexOf(')')).split(',').map((p) => p.trim());
  const checks = [];
  params.forEach((p, i) => {
    const m = p.match(/^(?:const\s+)?(\w+)\s*(\*?)\s*(\w+)$/);
    if (!m || p.startsWith('_')) return;  // void, _Out_/_Inout_ pointers
    const [, type, star, param] = m;
    if (!star && INT_RANGES[type]) checks.push([i, intChecker(name, param, INT_RANGES[type])]);
    else if (star && type === 'char') checks.push([i, cStringChecker(name, param)]);
  });
  if (!checks.length) return fn;
  const check = (args) => { for (const [i, c] of checks) c(args[i]); };
  const wrapped = (...args) => { check(args); return fn(...args); };
  wrapped.async = (...args) => { check(args); return fn.async(...args); };
  return wrapped;
}

module.exports = { load, checked };
