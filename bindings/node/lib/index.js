'use strict';
// moelite for Node.js: the C API through koffi (FFI, prebuilt: no compiler, no header download).
// Models and contexts own their native objects; close() frees them at once, and a finalizer frees
// what was not closed. Long calls (loading, evaluating, generating) have async forms that run on
// a worker thread, so the event loop keeps running; a context refuses a second call while one is
// in flight (one thread at a time, as the C API asks), and a second generation while one is
// under way (Status.BUSY). Integer arguments are checked against their C type and strings the C
// API takes NUL-terminated for NUL (lib/native.js): RangeError / TypeError, nothing truncated.
const { load } = require('./native');

const Status = Object.freeze({
  OK: 0, INVALID_ARGUMENT: 1, OUT_OF_MEMORY: 2, FILE_NOT_FOUND: 3, IO: 4, BUFFER_TOO_SMALL: 5,
  SYSTEM_LIMIT: 6, GGUF_BAD_MAGIC: 10, GGUF_BAD_VERSION: 11, GGUF_TRUNCATED: 12, GGUF_CORRUPT: 13,
  GGUF_UNKNOWN_TYPE: 14, GGUF_OUT_OF_BOUNDS: 15, GGUF_OVERLAP: 16, UNSUPPORTED_ARCH: 20,
  UNSUPPORTED_TYPE: 21, MISSING_TENSOR: 22, BAD_SHAPE: 23, MISSING_METADATA: 24, BAD_METADATA: 25,
  BACKEND_UNAVAILABLE: 30, BUDGET_TOO_SMALL: 31, NOT_IMPLEMENTED: 32, BAD_PROFILE: 33, BACKEND: 34,
  CONTEXT_FULL: 40, BAD_TOKEN: 41, ABORTED: 42, PROGRESS_ABORTED: 43, BUSY: 44, BAD_SESSION: 50,
  SESSION_MISMATCH: 51, INTERNAL: 99,
});
const Backend = Object.freeze({ AUTO: 0, CPU: 1, VULKAN: 2, CUDA: 3 });
const StopReason = Object.freeze(['end', 'max_tokens', 'stop', 'aborted', 'context_full', 'error']);
const MODEL_KEY = {
  N_LAYERS: 0, N_EXPERTS: 1, N_VOCAB: 4, N_CTX_TRAIN: 11, EXPERT_BYTES: 12, EXPERT_BUDGET: 19, EXPERT_SLOTS: 22,
  N_DENSE_LAYERS: 31,
};
const TOKENIZE_ADD_SPECIAL = 1, TOKENIZE_PARSE_SPECIAL = 2, DETOKENIZE_RENDER_SPECIAL = 1;

/** A failed call: `status` is the moelite_status number, `code` its name ("MOELITE_ERR_IO"). */
class MoeliteError extends Error {
  constructor(status, message) {
    const { fns } = load();
    const code = fns.moelite_status_name(status);
    super(`${code}: ${message}`);
    this.name = 'MoeliteError';
    this.status = status;
    this.code = code;
    this.detail = message;
  }
}

function check(status) {
  if (status !== 0) throw new MoeliteError(status, load().fns.moelite_last_error());
}

// An async call on koffi's worker thread; the error message is read on that thread's behalf:
// moelite_last_error is per thread, so the async call returns it along with the status.
function callAsync(fn, ...args) {
  return new Promise((resolve, reject) => {
    fn.async(...args, (err, res) => (err ? reject(err) : resolve(res)));
  });
}

function invalid(message) {
  return new MoeliteError(Status.INVALID_ARGUMENT, message);
}

// A context already in use: an async call in flight, or a generation under way.
function busy(message) {
  return new MoeliteError(Status.BUSY, message);
}

function version() {
  return load().fns.moelite_version_string();
}

const registry = new FinalizationRegistry(({ free, ptr }) => free(ptr));

function buildModelParams(opts) {
  const { fns } = load();
  const p = fns.moelite_model_params_create();
  if (!p) throw new MoeliteError(Status.OUT_OF_MEMORY, 'model parameters');
  try {
    if (opts.threads !== undefined) check(fns.moelite_model_params_set_threads(p, opts.threads));
    if (opts.backend !== undefined) {
      const b = typeof opts.backend === 'string' ? Backend[opts.backend.toUpperCase()] : opts.backend;
      if (b === undefined) throw invalid(`unknown backend ${opts.backend}`);
      check(fns.moelite_model_params_set_backend(p, b));
    }
    const budget = opts.budget;
    if (typeof budget === 'number' || typeof budget === 'bigint') {
      check(fns.moelite_model_params_set_expert_budget(p, budget));
    } else if (typeof budget === 'string') {
      // Parsed by the library, so "25%" or "2GiB" means here what it means everywhere.
      check(fns.moelite_model_params_set_expert_budget_text(p, budget));
    } else if (budget !== undefined) throw invalid('budget: a byte count, or text such as "2GiB", "25%" or "auto"');
    if (opts.policy !== undefined) check(fns.moelite_model_params_set_expert_policy(p, opts.policy));
    if (opts.predictor !== undefined) check(fns.moelite_model_params_set_predictor(p, opts.predictor));
    if (opts.allocation !== undefined) check(fns.moelite_model_params_set_cache_allocation(p, opts.allocation));
    if (opts.profile !== undefined) check(fns.moelite_model_params_set_profile(p, opts.profile));
    if (opts.gating !== undefined) {
      check(fns.moelite_model_params_set_gating(p, opts.gating.mode, opts.gating.threshold ?? 0));
      if (opts.gating.penalty !== undefined) check(fns.moelite_model_params_set_gating_penalty(p, opts.gating.penalty));
      if (opts.gating.substitutes !== undefined)
        check(fns.moelite_model_params_set_gating_substitutes(p, opts.gating.substitutes));
    }
    return p;
  } catch (e) {
    fns.moelite_model_params_free(p);
    throw e;
  }
}

function statsObject(s) {
  const n = (v) => Number(v);
  return {
    activations: n(s.activations), hits: n(s.hits), misses: n(s.misses),
    prefetchesIssued: n(s.prefetches_issued), prefetchesUsed: n(s.prefetches_used),
    prefetchesWasted: n(s.prefetches_wasted), bytesRead: n(s.bytes_read), waitSeconds: s.wait_seconds,
    predicted: n(s.predicted), predictions: n(s.predictions), readyWhenNeeded: n(s.ready_when_needed),
    routedTokens: n(s.routed_tokens), routedExperts: n(s.routed_experts), readBusySeconds: s.read_busy_seconds,
    reads: n(s.reads),
    hitRate: n(s.activations) ? n(s.hits) / n(s.activations) : 1,
  };
}

function emptyStats() {
  return { struct_size: 16 * 8, activations: 0, hits: 0, misses: 0, prefetches_issued: 0, prefetches_used: 0,
    prefetches_wasted: 0, bytes_read: 0, wait_seconds: 0, predicted: 0, predictions: 0, ready_when_needed: 0,
    routed_tokens: 0, routed_experts: 0, read_busy_seconds: 0, reads: 0 };
}

function qualityObject(s) {
  const n = (v) => Number(v);
  return {
    gatedTokens: n(s.gated_tokens), predictedLoss: s.predicted_loss, meteredTokens: n(s.metered_tokens),
    klMean: s.kl_mean, klStderr: s.kl_stderr, top1Agreement: s.top1_agreement, top1Stderr: s.top1_stderr,
    predictedLossMetered: s.predicted_loss_metered, meterEvaluations: n(s.meter_evaluations),
    meterSeconds: s.meter_seconds, threshold: s.threshold, targetKl: s.target_kl,
    klPerPredicted: s.kl_per_predicted,
  };
}

function emptyQualityStats() {
  return { struct_size: 14 * 8, gated_tokens: 0, predicted_loss: 0, metered_tokens: 0, kl_mean: 0, kl_stderr: 0,
    top1_agreement: 0, top1_stderr: 0, predicted_loss_metered: 0, meter_evaluations: 0, meter_seconds: 0,
    threshold: 0, target_kl: 0, kl_per_predicted: 0 };
}

// Calls f(buffer, capacity, lenOut) with a guess, then again with the size asked for.
function sized(guess, alloc, f) {
  let buf = alloc(Math.max(1, guess));
  let len = [0];
  let st = f(buf, buf.length, len);
  if (st === Status.BUFFER_TOO_SMALL) {
    buf = alloc(Math.max(1, Number(len[0])));
    len = [0];
    st = f(buf, buf.length, len);
  }
  check(st);
  return buf.subarray(0, Number(len[0]));
}

// Int32Array.from keeps the low 32 bits of each number (2 ** 32 + 1 becomes 1, 1.5 becomes 1), so
// each value is checked first: RangeError for a fraction, NaN or a value outside int32_t.
function toInt32Array(tokens, what = 'tokens') {
  if (tokens instanceof Int32Array) return tokens;
  if (!Array.isArray(tokens)) throw invalid(`${what}: an array of integers`);
  tokens.forEach((t, i) => {
    if (typeof t !== 'number') throw new TypeError(`${what}[${i}] must be a number, not ${typeof t}`);
    if (!Number.isInteger(t) || t < -(2 ** 31) || t > 2 ** 31 - 1)
      throw new RangeError(`${what}[${i}] is ${t}, not an int32_t`);
  });
  return Int32Array.from(tokens);
}

// Chat messages go to C as structs of NUL-terminated strings, which lib/native.js's checks do not
// see: a NUL would end a message early.
function checkMessages(messages) {
  if (!Array.isArray(messages)) throw invalid('messages: an array of {role, content}');
  for (const m of messages) {
    for (const k of ['role', 'content']) {
      if (typeof m?.[k] !== 'string') throw new TypeError(`each message needs a string ${k}`);
      if (m[k].includes('\0')) throw new TypeError(`a message's ${k} contains a NUL character`);
    }
  }
}

class Model {
  constructor(ptr) {
    const { fns } = load();
    this._ptr = ptr;
    this._token = {};
    registry.register(this, { free: fns.moelite_model_free, ptr }, this._token);
  }

  /** Loads a GGUF model (blocking). opts: threads, backend ('cpu' | 'vulkan' | 'cuda' | 'auto'),
   *  budget (bytes, or text the library parses: "2GiB", "25%", "auto", "none"), policy, predictor, allocation ('auto' | 'global' | 'uniform' | 'dp'),
   *  profile, gating {mode, threshold, penalty, substitutes}. */
  static load(path, opts = {}) {
    const { fns } = load();
    const p = buildModelParams(opts);
    try {
      const out = [null];
      check(fns.moelite_model_load(String(path), p, out));
      return new Model(out[0]);
    } finally {
      fns.moelite_model_params_free(p);
    }
  }

  /** The same on a worker thread. */
  static async loadAsync(path, opts = {}) {
    const { fns } = load();
    const p = buildModelParams(opts);
    try {
      const out = [null];
      const st = await callAsync(fns.moelite_model_load, String(path), p, out);
      if (st !== 0) throw new MoeliteError(st, loadErrorAfterAsync(path));
      return new Model(out[0]);
    } finally {
      fns.moelite_model_params_free(p);
    }
  }

  _handle() {
    if (!this._ptr) throw invalid('the model was closed');
    return this._ptr;
  }

  /** Frees the model now (contexts made from it keep it alive until they are closed). */
  close() {
    if (!this._ptr) return;
    registry.unregister(this._token);
    load().fns.moelite_model_free(this._ptr);
    this._ptr = null;
  }

  get(key) {
    return Number(load().fns.moelite_model_get(this._handle(), key));
  }
  get nVocab() { return this.get(MODEL_KEY.N_VOCAB); }
  get nLayers() { return this.get(MODEL_KEY.N_LAYERS); }
  get nCtxTrain() { return this.get(MODEL_KEY.N_CTX_TRAIN); }
  get expertBudget() { return this.get(MODEL_KEY.EXPERT_BUDGET); }
  /** Expert slots: of the store's pool under a budget, else every routed expert. */
  get expertSlots() { return this.get(MODEL_KEY.EXPERT_SLOTS); }
  get nExperts() { return this.get(MODEL_KEY.N_EXPERTS); }
  get nDenseLayers() { return this.get(MODEL_KEY.N_DENSE_LAYERS); }
  get arch() { return load().fns.moelite_model_arch(this._handle()); }
  get name() { return load().fns.moelite_model_name(this._handle()); }
  get backendName() { return load().fns.moelite_model_backend_name(this._handle()); }

  /** Token ids of `text` (Int32Array). */
  tokenize(text, { addSpecial = false, parseSpecial = false } = {}) {
    const { fns } = load();
    const bytes = Buffer.from(String(text), 'utf8');
    const flags = (addSpecial ? TOKENIZE_ADD_SPECIAL : 0) | (parseSpecial ? TOKENIZE_PARSE_SPECIAL : 0);
    return sized(bytes.length + 8, (n) => new Int32Array(n),
      (buf, cap, n) => fns.moelite_tokenize(this._handle(), bytes, bytes.length, flags, buf, cap, n));
  }

  /** The bytes `tokens` stand for, as a Buffer (one token's may end inside a character). */
  detokenizeBytes(tokens, { renderSpecial = false } = {}) {
    const { fns } = load();
    const ids = toInt32Array(tokens);
    const flags = renderSpecial ? DETOKENIZE_RENDER_SPECIAL : 0;
    return Buffer.from(sized(ids.length * 8 + 16, (n) => new Uint8Array(n),
      (buf, cap, len) => fns.moelite_detokenize(this._handle(), ids, ids.length, flags, buf, cap, len)));
  }

  detokenize(tokens, opts = {}) {
    return this.detokenizeBytes(tokens, opts).toString('utf8');
  }

  isEndToken(token) {
    return load().fns.moelite_token_is_end(this._handle(), token) !== 0;
  }

  /** Messages ({role, content}) formatted with the model's chat template. */
  chatFormat(messages, addAssistantPrompt = true) {
    const { fns } = load();
    checkMessages(messages);
    const bytes = sized(messages.reduce((a, m) => a + m.content.length * 3 + 64, 64), (n) => new Uint8Array(n),
      (buf, cap, len) => fns.moelite_chat_format(this._handle(), messages, messages.length,
        addAssistantPrompt ? 1 : 0, buf, cap, len));
    return Buffer.from(bytes).toString('utf8');
  }

  /** The conversation's tokens; message text stays text even where it spells a control token. */
  chatTokenize(messages, addAssistantPrompt = true) {
    const { fns } = load();
    checkMessages(messages);
    return sized(messages.reduce((a, m) => a + m.content.length + 32, 64), (n) => new Int32Array(n),
      (buf, cap, n) => fns.moelite_chat_tokenize(this._handle(), messages, messages.length,
        addAssistantPrompt ? 1 : 0, buf, cap, n));
  }

  /** The expert store's counters of every context (layer -1: all layers). */
  expertStats(layer = -1) {
    const s = emptyStats();
    check(load().fns.moelite_model_expert_stats(this._handle(), layer, s));
    return statsObject(s);
  }

  resetExpertStats() {
    load().fns.moelite_model_reset_expert_stats(this._handle());
  }

  /** Starts a timeline of the model's work (Chrome trace JSON that Perfetto opens) at `path`. */
  traceBegin(path) {
    check(load().fns.moelite_model_trace_begin(this._handle(), String(path)));
  }

  /** Stops the timeline and writes it. */
  traceEnd() {
    check(load().fns.moelite_model_trace_end(this._handle()));
  }
}

function loadErrorAfterAsync(path) {
  // The worker thread's message is not readable from here: say what is known.
  return `loading ${path} failed (see the status; the message stays on koffi's worker thread)`;
}

function buildGenerateParams(params) {
  const { fns } = load();
  const p = fns.moelite_generate_params_create();
  if (!p) throw new MoeliteError(Status.OUT_OF_MEMORY, 'generate parameters');
  try {
    if (params.maxTokens !== undefined) check(fns.moelite_generate_params_set_max_tokens(p, params.maxTokens));
    if (params.temperature !== undefined) check(fns.moelite_generate_params_set_temperature(p, params.temperature));
    if (params.topK !== undefined) check(fns.moelite_generate_params_set_top_k(p, params.topK));
    if (params.topP !== undefined) check(fns.moelite_generate_params_set_top_p(p, params.topP));
    if (params.minP !== undefined) check(fns.moelite_generate_params_set_min_p(p, params.minP));
    if (params.repeatPenalty !== undefined) {
      check(fns.moelite_generate_params_set_repeat_penalty(p, params.repeatPenalty, params.repeatLastN ?? 64));
    }
    if (params.seed !== undefined) {
      // BigInt() refuses a fraction (RangeError). A negative seed stands for its 64-bit two's
      // complement, as in the Python binding; beyond 64 bits it would be cut, so it is refused.
      const seed = BigInt(params.seed);
      if (seed < -(2n ** 63n) || seed >= 2n ** 64n) throw new RangeError(`seed ${seed} does not fit 64 bits`);
      check(fns.moelite_generate_params_set_seed(p, BigInt.asUintN(64, seed)));
    }
    for (const s of params.stop ?? []) check(fns.moelite_generate_params_add_stop(p, s));
    return p;
  } catch (e) {
    fns.moelite_generate_params_free(p);
    throw e;
  }
}

function emptyGenerateStats() {
  return { struct_size: 8 + 4 * 4 + 5 * 8, n_prompt_tokens: 0, n_cached_tokens: 0,
    n_generated_tokens: 0, stop_reason: 0, prompt_seconds: 0, generate_seconds: 0,
    time_to_first_token_seconds: 0, prompt_tokens_per_second: 0, generated_tokens_per_second: 0 };
}

const REQUEST_WAITING = -2, REQUEST_RUNNING = -1;

// A moelite_stop_reason, or a queued request's state, as its name.
function stateName(state) {
  if (state === REQUEST_WAITING) return 'waiting';
  if (state === REQUEST_RUNNING) return 'running';
  return StopReason[state] ?? 'error';
}

function generateStatsObject(stats) {
  return {
    promptTokens: stats.n_prompt_tokens, cachedTokens: stats.n_cached_tokens,
    generatedTokens: stats.n_generated_tokens, stopReason: stateName(stats.stop_reason),
    promptSeconds: stats.prompt_seconds, generateSeconds: stats.generate_seconds,
    timeToFirstTokenSeconds: stats.time_to_first_token_seconds,
    promptTokensPerSecond: stats.prompt_tokens_per_second,
    generatedTokensPerSecond: stats.generated_tokens_per_second,
  };
}

// Frees the native queues in `queues` (a set of pointers) and empties it.
function freeQueues(queues) {
  const { fns } = load();
  for (const q of queues) fns.moelite_queue_free(q);
  queues.clear();
}

// The longest end of `text` that begins some stop string.
function heldBack(text, stops) {
  let hold = 0;
  for (const s of stops) {
    for (let n = Math.min(s.length - 1, text.length); n > hold; --n) {
      if (text.endsWith(s.slice(0, n))) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

class Context {
  /** opts: nCtx, nBatch, nSeq; for lossy gating qualitySample (the share of decode steps the
   *  quality meter compares with exact routing, 0..1), qualityTarget (the governor's target: a
   *  perplexity rise "1%" or "kl:0.01"; needs sensitivity or cache-aware gating, whose profile it
   *  makes optional) and qualityBounds ([min, max] thresholds the governor may use). */
  constructor(model, opts = {}) {
    const { fns } = load();
    const p = fns.moelite_context_params_create();
    if (!p) throw new MoeliteError(Status.OUT_OF_MEMORY, 'context parameters');
    try {
      if (opts.nCtx !== undefined) check(fns.moelite_context_params_set_n_ctx(p, opts.nCtx));
      if (opts.nBatch !== undefined) check(fns.moelite_context_params_set_n_batch(p, opts.nBatch));
      if (opts.nSeq !== undefined) check(fns.moelite_context_params_set_n_seq(p, opts.nSeq));
      if (opts.qualitySample !== undefined) check(fns.moelite_context_params_set_quality_meter(p, opts.qualitySample));
      if (opts.qualityTarget !== undefined) {
        // koffi would pass a number or an object as some other string, or refuse it obscurely.
        if (typeof opts.qualityTarget !== 'string') {
          throw new TypeError('qualityTarget must be a string such as "1%" or "kl:0.01"');
        }
        check(fns.moelite_context_params_set_quality_target(p, opts.qualityTarget));
      }
      if (opts.qualityBounds !== undefined) {
        const b = opts.qualityBounds;
        if (!Array.isArray(b) || b.length !== 2) throw invalid('qualityBounds: [min, max] thresholds');
        check(fns.moelite_context_params_set_quality_bounds(p, b[0], b[1]));
      }
      const out = [null];
      check(fns.moelite_context_create(model._handle(), p, out));
      this._ptr = out[0];
    } finally {
      fns.moelite_context_params_free(p);
    }
    this._model = model;
    this._nVocab = model.nVocab;
    this._busy = false;
    this._generation = null;  // the owner token of the generate() iterator under way, if any
    this._token = {};
    // The native queues over this context (pointers): freed before it, whichever of a queue and
    // its context the collector finalizes first (a queue borrows its context).
    const queues = new Set();
    this._queues = queues;
    registry.register(this, { free: (ptr) => { freeQueues(queues); fns.moelite_context_free(ptr); }, ptr: this._ptr },
      this._token);
  }

  // The pointer for a call that reads the context: refused once closed or while an async call is
  // in flight (its worker thread is inside the library with it).
  _read() {
    if (!this._ptr) throw invalid('the context was closed');
    if (this._busy) throw busy('the context is busy with an async call (one call at a time)');
    return this._ptr;
  }

  // The pointer for a call that changes the context: refused as _read() does, and while a
  // generate() iterator other than `owner` is under way (it would see its sequence change
  // between two of its steps).
  _handle(owner = null) {
    const h = this._read();
    if (this._generation !== null && this._generation !== owner) {
      throw busy('a generation is under way on this context (one at a time): end its loop, or call return() on ' +
                 'its iterator, first');
    }
    return h;
  }

  // call() (a promise of a worker-thread call) with every other call on the context and its
  // queues refused meanwhile.
  async _exclusive(call, owner = null) {
    this._handle(owner);
    this._busy = true;
    try {
      return await call();
    } finally {
      this._busy = false;
    }
  }

  // fn(handle, ...args) on koffi's worker thread; resolves to the status.
  async _callAsync(fn, ...args) {
    return this._callAsyncFor(null, fn, ...args);
  }

  async _callAsyncFor(owner, fn, ...args) {
    const h = this._handle(owner);
    return this._exclusive(() => callAsync(fn, h, ...args), owner);
  }

  /** Frees the context now, and first the queues over it (they refuse calls afterwards). While an
   *  async call is in flight it throws (Status.BUSY) and frees nothing; a generate() iterator
   *  under way then throws 'the context was closed' at its next step. */
  close() {
    if (!this._ptr) return;
    if (this._busy) throw busy('the context is busy with an async call: await it before close()');
    registry.unregister(this._token);
    freeQueues(this._queues);
    load().fns.moelite_context_free(this._ptr);
    this._ptr = null;
  }

  /** Appends tokens to sequence 0 and evaluates them (blocking). */
  eval(tokens, { logitsAll = false } = {}) {
    const ids = toInt32Array(tokens);
    check(load().fns.moelite_eval(this._handle(), ids, ids.length, logitsAll ? 1 : 0));
  }

  /** The same on a worker thread: the event loop runs meanwhile. */
  async evalAsync(tokens, { logitsAll = false } = {}) {
    return this._evalAsync(tokens, logitsAll, null);
  }

  async _evalAsync(tokens, logitsAll, owner) {
    const ids = toInt32Array(tokens);
    const st = await this._callAsyncFor(owner, load().fns.moelite_eval, ids, ids.length, logitsAll ? 1 : 0);
    if (st !== 0) throw new MoeliteError(st, `evaluating ${ids.length} tokens failed`);
  }

  /** Tokens of several sequences in one pass (token i to sequence seqIds[i]); logits kept for
   *  wantLogits[i] (default: each sequence's last token). */
  evalBatch(tokens, seqIds, wantLogits = null) {
    const ids = toInt32Array(tokens), seqs = toInt32Array(seqIds, 'seqIds');
    if (seqs.length !== ids.length || (wantLogits && wantLogits.length !== ids.length)) {
      throw invalid('evalBatch: tokens, seqIds and wantLogits differ in length');
    }
    const want = wantLogits ? Uint8Array.from(wantLogits, (b) => (b ? 1 : 0)) : null;
    check(load().fns.moelite_eval_batch(this._handle(), ids, seqs, want, ids.length));
  }

  /** A copy of row i's logits (-1: the last), or null when the row has none. */
  logits(i = -1) {
    const { fns, koffi } = load();
    const p = fns.moelite_get_logits(this._read(), i);
    if (!p) return null;
    return new Float32Array(koffi.view(p, this._nVocab * 4).slice(0));
  }

  get kvLength() { return load().fns.moelite_context_kv_length(this._read()); }
  get nCtx() { return load().fns.moelite_context_n_ctx(this._read()); }
  kvReset() { load().fns.moelite_context_kv_reset(this._handle()); }
  kvTruncate(nKeep) { load().fns.moelite_context_kv_truncate(this._handle(), nKeep); }
  seqLength(seq) { return load().fns.moelite_context_seq_length(this._read(), seq); }
  seqTruncate(seq, nKeep) { check(load().fns.moelite_context_seq_truncate(this._handle(), seq, nKeep)); }

  /** The tokens sequence 0's cache holds. */
  tokens() {
    const { fns } = load();
    return sized(this.kvLength, (n) => new Int32Array(n),
      (buf, cap, n) => fns.moelite_context_get_tokens(this._read(), buf, cap, n));
  }

  save(path) { check(load().fns.moelite_context_save(this._read(), String(path))); }
  load(path) { check(load().fns.moelite_context_load(this._handle(), String(path))); }

  /** This context's own expert-store counters. */
  expertStats(layer = -1) {
    const s = emptyStats();
    check(load().fns.moelite_context_expert_stats(this._read(), layer, s));
    return statsObject(s);
  }

  resetExpertStats() { load().fns.moelite_context_reset_expert_stats(this._handle()); }

  /** What lossy gating cost this context: the quality meter's KL (nats per token) and top-1
   *  agreement against exact routing, the sensitivity model's predicted loss, the governor's
   *  threshold and target (targetKl 0: no governor). All 0 with exact gating. */
  qualityStats() {
    const s = emptyQualityStats();
    check(load().fns.moelite_context_quality_stats(this._read(), s));
    return qualityObject(s);
  }

  /** The library's generation loop on a worker thread: resolves to {text, stats}. params:
   *  maxTokens, temperature, topK, topP, minP, repeatPenalty, repeatLastN, seed, stop (array). */
  async generateText(prompt, params = {}) {
    const { fns, koffi, pieceFn } = load();
    this._handle();  // closed or busy: refused before anything is registered
    const p = buildGenerateParams(params);
    const chunks = [];
    const cb = koffi.register((piece, len) => {
      chunks.push(Buffer.from(koffi.view(piece, Number(len)).slice(0)));
      return 1;
    }, koffi.pointer(pieceFn));
    const stats = emptyGenerateStats();
    let st;
    try {
      check(fns.moelite_generate_params_set_callback(p, cb, null));
      const bytes = Buffer.from(String(prompt), 'utf8');
      st = await this._callAsync(fns.moelite_generate, bytes, bytes.length, p, stats);
    } finally {
      koffi.unregister(cb);
      fns.moelite_generate_params_free(p);
    }
    if (st !== 0) throw new MoeliteError(st, 'generation failed');
    return { text: Buffer.concat(chunks).toString('utf8'), stats: generateStatsObject(stats) };
  }

  /** Streams the completion of `prompt` (text, tokenized with control text parsed as
   *  moelite_generate does, or token ids) as an async iterator of {id, text}: each step evaluates
   *  the previous token on a worker thread and draws the next. `text` holds only whole
   *  characters and never the start of a possible stop string (it comes with a later token).
   *  params as generateText, plus `signal` (an AbortSignal checked between tokens). The
   *  iterator's `stopReason` says why it ended.
   *
   *  One generation per context at a time: from its first next() until its loop ends (or
   *  return() is called on it, as `break` does), another generate() or generateText() on the
   *  context, and every call that changes it (eval, kvTruncate, seqTruncate, load, queues),
   *  throws MoeliteError Status.BUSY at once; the generation goes on undisturbed. Reads
   *  (tokens(), kvLength, logits()) stay open between its steps. close() ends it: its next step
   *  throws 'the context was closed'. */
  generate(prompt, params = {}) {
    const ctx = this;
    const { fns } = load();
    const model = this._model;
    const ids = typeof prompt === 'string'
      ? model.tokenize(prompt, { addSpecial: true, parseSpecial: true }) : toInt32Array(prompt);
    if (ids.length === 0) throw invalid('generate: the prompt is empty');
    const stops = params.stop ?? [];
    const iterator = {
      stopReason: null,
      async *[Symbol.asyncIterator]() {
        // This generation's claim on the context (see above): its own calls pass `owner`.
        const owner = {};
        ctx._handle();  // BUSY while another generation (or an async call) is under way
        const p = buildGenerateParams(params);
        const out = [null];
        try {
          check(fns.moelite_sampler_create(p, out));
        } finally {
          fns.moelite_generate_params_free(p);
        }
        const sampler = out[0];
        ctx._generation = owner;
        try {
          // Keep the cache's common prefix with the prompt (at least its last token is evaluated).
          const cached = ctx.tokens();
          let keep = 0;
          while (keep < Math.min(cached.length, ids.length - 1) && cached[keep] === ids[keep]) ++keep;
          fns.moelite_context_kv_truncate(ctx._handle(owner), keep);
          await ctx._evalAsync(ids.subarray(keep), false, owner);
          check(fns.moelite_sampler_accept(sampler, ids, ids.length));
          let left = params.maxTokens ?? 256;
          let pending = Buffer.alloc(0), held = '';
          const decoder = new TextDecoder('utf-8', { fatal: false });
          for (;;) {
            if (params.signal?.aborted) { iterator.stopReason = 'aborted'; return; }
            if (left <= 0) { iterator.stopReason = 'max_tokens'; return; }
            const tok = [0];
            check(fns.moelite_sampler_sample(sampler, ctx._handle(owner), -1, tok));
            const id = tok[0];
            if (model.isEndToken(id)) {
              iterator.stopReason = 'end';
              const rest = held + decoder.decode(pending);
              if (rest) yield { id, text: rest };
              return;
            }
            --left;
            pending = Buffer.concat([pending, model.detokenizeBytes([id])]);
            // Whole characters only: stop before an incomplete sequence at the end.
            let cut = pending.length;
            for (let back = 1; back <= Math.min(3, pending.length); ++back) {
              const b = pending[pending.length - back];
              if ((b & 0xc0) === 0x80) continue; // a continuation byte
              const need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
              if (need > back) cut = pending.length - back;
              break;
            }
            if (left === 0) cut = pending.length;
            let text = held + decoder.decode(pending.subarray(0, cut));
            pending = pending.subarray(cut);
            held = '';
            const at = stops.map((s) => text.indexOf(s)).filter((i) => i >= 0);
            if (at.length) {
              iterator.stopReason = 'stop';
              yield { id, text: text.slice(0, Math.min(...at)) };
              return;
            }
            if (left > 0) {
              const hold = heldBack(text, stops);
              held = text.slice(text.length - hold);
              text = text.slice(0, text.length - hold);
            }
            yield { id, text };
            if (left > 0) await ctx._evalAsync([id], false, owner);
          }
        } finally {
          if (ctx._generation === owner) ctx._generation = null;
          fns.moelite_sampler_free(sampler);
        }
      },
    };
    return iterator;
  }
}

/** Many generation requests decoded together by one context's sequences (moelite_queue_*):
 *  continuous batching. Up to the context's nSeq requests run at once; each step() evaluates the
 *  next token of every running request with prompt chunks of newly admitted ones in one forward
 *  pass on a worker thread, so they share the weight reads and, under a budget, each expert's
 *  load. A request's tokens, text and stop reason are exactly what generateText() gives for it
 *  alone with the same params, whatever runs beside it; a request whose prompt starts with what
 *  a free sequence holds (a shared system prompt, a conversation's next turn) evaluates only the
 *  rest. The queue borrows the context: while it lives, do not evaluate the context yourself (a
 *  running request whose sequence changed ends with 'error'); context.close() closes it. While a
 *  step runs, every other call on the queue and its context is refused (one call at a time).
 *
 *      const q = new Queue(ctx);
 *      const ids = prompts.map((p, i) => q.add(p, { maxTokens: 64, seed: i }));
 *      for await (const { id, text, state } of q.run()) ...;
 *      const texts = ids.map((id) => q.text(id));
 */
class Queue {
  constructor(ctx) {
    if (!(ctx instanceof Context)) throw invalid('Queue: ctx must be a Context');
    const { fns } = load();
    const out = [null];
    check(fns.moelite_queue_create(ctx._handle(), out));
    this._ptr = out[0];
    this._ctx = ctx;
    this._emitted = new Map(); // request id -> bytes of its text already given out in events
    const queues = ctx._queues;
    queues.add(this._ptr);
    this._token = {};
    registry.register(this, { free: (ptr) => { if (queues.delete(ptr)) fns.moelite_queue_free(ptr); }, ptr: this._ptr },
      this._token);
  }

  _handle() {
    this._ctx._handle(); // closed or busy: refused
    if (!this._ptr || !this._ctx._queues.has(this._ptr)) throw invalid('the queue was closed');
    return this._ptr;
  }

  /** Frees the queue and its requests (the context stays). Idempotent. */
  close() {
    if (!this._ptr) return;
    if (this._ctx._busy) throw busy('the context is busy with an async call: await it before close()');
    registry.unregister(this._token);
    if (this._ctx._queues.delete(this._ptr)) load().fns.moelite_queue_free(this._ptr);
    this._ptr = null;
  }

  /** Queues a request and returns its id (0, 1, 2 ... in order of addition). `prompt`: text
   *  (tokenized with the vocabulary's BOS/EOS and, unless params.parseSpecial is false,
   *  control-token text as control tokens, as generateText) or token ids. params as
   *  generateText. Throws BAD_TOKEN, CONTEXT_FULL (longer than a sequence), INVALID_ARGUMENT. */
  add(prompt, params = {}) {
    const { fns } = load();
    const q = this._handle();
    const ids = typeof prompt === 'string'
      ? this._ctx._model.tokenize(prompt, { addSpecial: true, parseSpecial: params.parseSpecial ?? true })
      : toInt32Array(prompt);
    const p = buildGenerateParams(params);
    try {
      const out = [0];
      check(fns.moelite_queue_add(q, ids, ids.length, p, out));
      return Number(out[0]);
    } finally {
      fns.moelite_generate_params_free(p);
    }
  }

  /** One step on a worker thread; resolves to its events, one per request that drew a token or
   *  finished: {id, token (null when none), text (what the request's text gained: whole
   *  characters, stop strings cut), state ('running' or a stop reason)}. [] when nothing waits
   *  or runs. A failed step (IO, ...) rejects with MoeliteError; then nothing changed and the
   *  next step tries again. */
  async step() {
    const { fns } = load();
    const q = this._handle();
    const n = [0];
    const st = await this._ctx._exclusive(() => callAsync(fns.moelite_queue_step, q, n));
    if (st !== 0) throw new MoeliteError(st, 'the queue step failed (the message stays on koffi\'s worker thread)');
    const events = [];
    for (let i = 0; i < n[0]; ++i) {
      const id = [0], token = [0], state = [0];
      check(fns.moelite_queue_event(q, i, id, token, state));
      const rid = Number(id[0]);
      const seen = this._emitted.get(rid) ?? 0;
      const bytes = this._textBytes(q, rid, seen + 256); // room for what it had and a step's more
      this._emitted.set(rid, bytes.length);
      events.push({ id: rid, token: token[0] < 0 ? null : token[0], text: bytes.subarray(seen).toString('utf8'),
        state: stateName(state[0]) });
    }
    return events;
  }

  /** Steps until no request waits or runs, yielding every event. */
  async *run() {
    while (this.busy) yield* await this.step();
  }

  get waiting() { return Number(load().fns.moelite_queue_waiting(this._handle())); }
  get running() { return Number(load().fns.moelite_queue_running(this._handle())); }
  /** Finished requests not yet removed. */
  get finished() { return Number(load().fns.moelite_queue_finished(this._handle())); }
  get busy() { return this.waiting + this.running > 0; }

  /** 'waiting', 'running', or the stop reason it finished with. */
  state(id) {
    const out = [0];
    check(load().fns.moelite_queue_request_state(this._handle(), id, out));
    return stateName(out[0]);
  }

  /** Its counts and times so far (generateText's stats; stopReason 'waiting' or 'running' until
   *  it ends; cachedTokens: prompt tokens its sequence already held). */
  stats(id) {
    const s = emptyGenerateStats();
    check(load().fns.moelite_queue_request_stats(this._handle(), id, s));
    return generateStatsObject(s);
  }

  /** The tokens it generated so far (an end token is not one of them). */
  tokens(id) {
    const { fns } = load();
    const q = this._handle();
    return sized(64, (n) => new Int32Array(n), (buf, cap, n) => fns.moelite_queue_request_tokens(q, id, buf, cap, n));
  }

  /** The text it emitted so far, as bytes and as a string. */
  textBytes(id) { return this._textBytes(this._handle(), id, 256); }

  _textBytes(q, id, guess) {
    const { fns } = load();
    return Buffer.from(sized(guess, (n) => new Uint8Array(n), (buf, cap, len) => fns.moelite_queue_request_text(q, id, buf, cap, len)));
  }

  text(id) { return this.textBytes(id).toString('utf8'); }

  /** Ends a waiting or running request at once ('aborted'), freeing its sequence. */
  cancel(id) { check(load().fns.moelite_queue_cancel(this._handle(), id)); }

  /** Cancels it if it runs and forgets it (finished requests are kept until removed). */
  remove(id) {
    check(load().fns.moelite_queue_remove(this._handle(), id));
    this._emitted.delete(Number(id));
  }
}

module.exports = { Model, Context, Queue, MoeliteError, Status, Backend, version };
