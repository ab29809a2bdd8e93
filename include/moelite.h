/*
 * moelite.h — the public C API of moelite, an embeddable engine for Mixture-of-Experts
 * language models stored as GGUF files.
 *
 * This is the only header an application includes. It is plain C99 and has no dependencies.
 *
 * Conventions that hold for every function below unless its comment says otherwise:
 *
 *  - Errors. Functions that can fail return a moelite_status. MOELITE_OK (0) is success; any
 *    other value names the failure, and moelite_last_error() returns a human-readable message
 *    for the most recent failure *on the calling thread*; successful calls never change it. A
 *    failing call never aborts the process and leaves its output arguments untouched, with two
 *    exceptions stated where they apply: MOELITE_ERR_BUFFER_TOO_SMALL writes the size needed,
 *    and the generation functions fill their stats (what was done before the failure).
 *  - Ownership. Handles (moelite_model, moelite_context, ...) are opaque. Whoever receives a
 *    handle from a *_create / *_load function owns it and releases it with the matching *_free
 *    function. *_free accepts NULL. Pointers returned by getters stay owned by the library and
 *    are valid for as long as the text says.
 *  - Threads. A moelite_model is immutable after loading: any number of threads may query it and
 *    create contexts from it concurrently. A moelite_context must be used by one thread at a time,
 *    and this is checked: a call on a context (or on a queue over it) that another thread is
 *    inside a call on returns MOELITE_ERR_BUSY at once and changes nothing; the functions without
 *    a status then do nothing (moelite_context_kv_reset, _kv_truncate, _reset_expert_stats) or
 *    return NULL (moelite_get_logits), and the lengths (moelite_context_kv_length, _seq_length)
 *    may be out of date. Callbacks run inside their call and may use its context on that thread.
 *    What cannot be checked is a handle used after, or while, another thread frees it: free a
 *    model or a context only once every call on it has returned.
 *    Contexts of one model evaluate at the same time from different threads on the CPU, Vulkan
 *    and CUDA backends: each context then has its own worker threads (CPU) or command streams
 *    (GPU) and scratch, and GPU contexts share the device's copies of the weights and, on a
 *    discrete GPU under a budget, its expert slots. With an expert budget they share the store
 *    (its slots never exceed the budget, and one read of an expert serves every context using
 *    it): a layer's experts wait, if need be, until the pins they ask for fit beside other
 *    contexts', first come first served, so every context makes progress. Contexts take turns
 *    instead, each evaluation waiting for the one before, with cache-aware gating (its choice
 *    reads what is resident). With a predictor each context evaluating at the same time guesses
 *    with one of its own (its correlation counts start as the model's and then learn from its own
 *    tokens). Either way results are those of a context alone, and a context waiting for another
 *    honours its abort callback.
 *    Parameter objects are plain data owned by the caller; do not share one between threads while
 *    it is being modified.
 *  - ABI. Options are set through setters on opaque parameter objects and queries go through
 *    keys, so new options and new queries are added without changing any existing signature.
 *    Enum values are stable and only ever appended.
 *  - Names. moelite_<object>_<verb>: moelite_model_*, moelite_context_*, moelite_sampler_*,
 *    moelite_queue_*, moelite_token_*; parameter setters moelite_<object>_params_set_*. The expert store's
 *    options are "cache" options (policy, allocation). "Aborted" always means that a callback of
 *    the application asked to stop. Names replaced by this scheme still work for one release
 *    and are marked MOELITE_DEPRECATED (a compiler warning names the replacement).
 */
#ifndef MOELITE_H
#define MOELITE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#if defined(MOELITE_BUILDING)
#define MOELITE_API __declspec(dllexport)
#else
#define MOELITE_API
#endif
#else
#define MOELITE_API __attribute__((visibility("default")))
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MOELITE_DEPRECATED(replacement) __attribute__((deprecated("use " replacement)))
#else
#define MOELITE_DEPRECATED(replacement)
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version                                                                                      */
/* ------------------------------------------------------------------------------------------ */

#define MOELITE_VERSION_MAJOR 0
#define MOELITE_VERSION_MINOR 1
#define MOELITE_VERSION_PATCH 0
/** The version this header belongs to, as MAJOR*10000 + MINOR*100 + PATCH. */
#define MOELITE_VERSION_NUMBER (MOELITE_VERSION_MAJOR * 10000 + MOELITE_VERSION_MINOR * 100 + MOELITE_VERSION_PATCH)

/** Version of the library actually linked, same encoding as MOELITE_VERSION_NUMBER.
 *  Compare with MOELITE_VERSION_NUMBER to detect a header/library mismatch. */
MOELITE_API unsigned moelite_version_number(void);
/** The linked library's version as "MAJOR.MINOR.PATCH"; static storage, never NULL. */
MOELITE_API const char* moelite_version_string(void);

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum moelite_status {
  MOELITE_OK = 0,
  MOELITE_ERR_INVALID_ARGUMENT = 1,     /* NULL handle, out-of-range value, bad option */
  MOELITE_ERR_OUT_OF_MEMORY = 2,        /* an allocation failed */
  MOELITE_ERR_FILE_NOT_FOUND = 3,       /* the path does not exist or cannot be opened */
  MOELITE_ERR_IO = 4,                   /* a read, map or stat failed, or returned fewer bytes */
  MOELITE_ERR_BUFFER_TOO_SMALL = 5,     /* an output buffer is too small; the size needed is
                                           returned through the function's length argument */
  MOELITE_ERR_SYSTEM_LIMIT = 6,         /* the OS refused a thread or another resource (ulimit -u,
                                           cgroup pids.max); the message says which */
  MOELITE_ERR_GGUF_BAD_MAGIC = 10,      /* not a GGUF file */
  MOELITE_ERR_GGUF_BAD_VERSION = 11,    /* GGUF version other than 2 or 3 */
  MOELITE_ERR_GGUF_TRUNCATED = 12,      /* the file ends inside the header, metadata or tensor data */
  MOELITE_ERR_GGUF_CORRUPT = 13,        /* absurd count or length, bad string, duplicate name,
                                           bad alignment, bad dimensions */
  MOELITE_ERR_GGUF_UNKNOWN_TYPE = 14,   /* unknown metadata value type or tensor type id */
  MOELITE_ERR_GGUF_OUT_OF_BOUNDS = 15,  /* a tensor's data lies (partly) outside the file */
  MOELITE_ERR_GGUF_OVERLAP = 16,        /* two tensors' data overlap */
  MOELITE_ERR_UNSUPPORTED_ARCH = 20,    /* general.architecture is not one moelite implements */
  MOELITE_ERR_UNSUPPORTED_TYPE = 21,    /* a weight uses a quantization type moelite lacks */
  MOELITE_ERR_MISSING_TENSOR = 22,      /* a tensor the architecture needs is absent */
  MOELITE_ERR_BAD_SHAPE = 23,           /* a tensor's shape disagrees with the hyperparameters */
  MOELITE_ERR_MISSING_METADATA = 24,    /* a required metadata key is absent or mistyped */
  MOELITE_ERR_BAD_METADATA = 25,        /* a metadata value is out of range or inconsistent */
  MOELITE_ERR_BACKEND_UNAVAILABLE = 30, /* the requested compute backend is not built/present */
  MOELITE_ERR_BUDGET_TOO_SMALL = 31,    /* expert memory budget below the minimum working set */
  MOELITE_ERR_NOT_IMPLEMENTED = 32,     /* a recognised request this build cannot serve yet */
  MOELITE_ERR_BAD_PROFILE = 33,         /* a calibration profile is malformed, of an unsupported
                                           version, or made for another model */
  MOELITE_ERR_BACKEND = 34,             /* a compute backend failed: a device error, or a kernel fault
                                           such as a deadlock found by the SIMT emulator */
  MOELITE_ERR_CONTEXT_FULL = 40,        /* the batch would run past the context length */
  MOELITE_ERR_BAD_TOKEN = 41,           /* a token id outside [0, n_vocab) */
  MOELITE_ERR_ABORTED = 42,             /* the abort callback asked to stop an evaluation */
  MOELITE_ERR_PROGRESS_ABORTED = 43,    /* a progress callback asked to stop loading or calibrating */
  MOELITE_ERR_BUSY = 44,                /* another thread is inside a call on the context (or its
                                           queue); nothing was done (see Threads above) */
  MOELITE_ERR_BAD_SESSION = 50,         /* a saved session is not one, is truncated or corrupt, or of
                                           an unsupported version */
  MOELITE_ERR_SESSION_MISMATCH = 51,    /* a saved session was made by another model, or holds more
                                           sequences or positions than the context */
  MOELITE_ERR_INTERNAL = 99,            /* a bug in moelite; please report it */
  /* Deprecated spelling of MOELITE_ERR_PROGRESS_ABORTED (same value). */
  MOELITE_ERR_CANCELLED MOELITE_DEPRECATED("MOELITE_ERR_PROGRESS_ABORTED") = 43
} moelite_status;

/** Short constant name of a status ("MOELITE_ERR_IO"); "MOELITE_ERR_UNKNOWN" for a value that is
 *  not a moelite_status; static storage, never NULL. */
MOELITE_API const char* moelite_status_name(moelite_status status);

/** Message describing the most recent failure on the calling thread ("" if none yet). The text
 *  and the pointer stay valid until the next *failing* moelite call on the same thread:
 *  successful calls (and calls on other threads) never change it, so it may be read after other
 *  calls, e.g. in the same printf as moelite_status_name(). Thread-safe. */
MOELITE_API const char* moelite_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Logging                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef enum moelite_log_level {
  MOELITE_LOG_DEBUG = 0,
  MOELITE_LOG_INFO = 1,
  MOELITE_LOG_WARN = 2,
  MOELITE_LOG_ERROR = 3,
  MOELITE_LOG_NONE = 4
} moelite_log_level;

/** Receives one complete line of log text, without a trailing newline. May be called from any
 *  thread that runs moelite work, so it must be thread-safe. The text is valid during the call. */
typedef void (*moelite_log_fn)(moelite_log_level level, const char* text, void* user_data);

/** Installs the process-wide log sink. NULL restores the default (stderr, WARN and above).
 *  Messages below min_level are not formatted at all. Thread-safe. */
MOELITE_API void moelite_set_log_callback(moelite_log_fn fn, void* user_data, moelite_log_level min_level);

/* ------------------------------------------------------------------------------------------ */
/* Model loading                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef struct moelite_model moelite_model;
typedef struct moelite_model_params moelite_model_params;

typedef enum moelite_backend {
  MOELITE_BACKEND_AUTO = 0, /* the best backend present: CUDA on an NVIDIA GPU (Jetson's
                               included) if built and found, else Vulkan on a GPU (not on a CPU
                               implementation such as lavapipe) if built and found, else CPU;
                               MOELITE_PLATFORM_AUTO_BACKEND and moelite_platform_describe_json
                               say which and why */
  MOELITE_BACKEND_CPU = 1,
  MOELITE_BACKEND_VULKAN = 2,
  MOELITE_BACKEND_CUDA = 3
} moelite_backend;

/** Called during loading with progress in [0, 1]. Return 0 to cancel the load (the load then
 *  fails with MOELITE_ERR_PROGRESS_ABORTED and releases everything it allocated), non-zero to go on.
 *  Runs on the loading thread. */
typedef int (*moelite_progress_fn)(float progress, void* user_data);

/** Creates a parameter object holding the defaults: backend AUTO, threads = number of physical
 *  cores (the big cores on a big.LITTLE CPU), all experts resident (no budget), mmap on, no
 *  progress callback.
 *  Returns NULL only when out of memory. Free with moelite_model_params_free(). */
MOELITE_API moelite_model_params* moelite_model_params_create(void);
MOELITE_API void moelite_model_params_free(moelite_model_params* params);

/** Most compute threads a model may use (more would only contend; larger counts are refused). */
#define MOELITE_MAX_THREADS 512
/** Number of compute threads, 1..MOELITE_MAX_THREADS; 0 restores the default: physical cores, or
 *  on a heterogeneous CPU (big.LITTLE) the big cores among those the process may use
 *  (sched_getaffinity), see MOELITE_PLATFORM_BIG_CORES. On such a CPU the CPU backend's worker
 *  threads are restricted to the big cores unless more threads than big cores are asked for;
 *  the calling thread is never re-pinned.
 *  MOELITE_ERR_INVALID_ARGUMENT outside that range. If the OS refuses to start one of them,
 *  moelite_model_load fails with MOELITE_ERR_SYSTEM_LIMIT (no thread is left behind). */
MOELITE_API moelite_status moelite_model_params_set_threads(moelite_model_params* params, int32_t n_threads);
/** Compute backend. Asking for a backend this build or machine lacks makes moelite_model_load
 *  fail with MOELITE_ERR_BACKEND_UNAVAILABLE and a message saying why. MOELITE_BACKEND_VULKAN
 *  takes the best Vulkan device, CPU implementations included (environment MOELITE_VK_DEVICE=N
 *  forces device N). */
MOELITE_API moelite_status moelite_model_params_set_backend(moelite_model_params* params, moelite_backend backend);
/** Bytes of memory the routed-expert weights may occupy. 0 (default): every expert stays in the
 *  file mapping (the OS pages it in). Any other value: experts are read from the model file on
 *  demand into a pool of expert slots that never exceeds `budget_bytes`, bypassing the OS page
 *  cache where the file system allows (O_DIRECT). Loading fails with MOELITE_ERR_BUDGET_TOO_SMALL,
 *  stating the minimum, when fewer than top-k + 1 experts fit. Results do not depend on the
 *  budget (bitwise), only speed does. MOELITE_ERR_INVALID_ARGUMENT above 2^62 bytes.
 *  Replaces an earlier moelite_model_params_set_expert_budget_auto (the last call wins). */
MOELITE_API moelite_status moelite_model_params_set_expert_budget(moelite_model_params* params, uint64_t budget_bytes);
/** Most headroom moelite_model_params_set_expert_budget_auto accepts (2^62 bytes). */
#define MOELITE_MAX_BUDGET_HEADROOM ((uint64_t)1 << 62)
/** Sizes the expert budget at load from the memory the process may take at that moment:
 *
 *    room   = min(MemAvailable, cgroup memory limit - cgroup usage)   (MOELITE_PLATFORM_MEM_AVAILABLE_BYTES)
 *    budget = room - dense (non-expert) weights - KV cache and scratch of one context with default
 *             parameters - headroom_bytes
 *
 *  `headroom_bytes` is memory left for everything else (the application, allocator slack, larger
 *  contexts than the default); 0 takes the default, max(64 MiB, 10 % of room). The dense weights
 *  count twice with a GPU backend on unified memory (Jetson), whose device copy lives in the same
 *  DRAM. If the result holds every expert, the budget is that pool's size and every expert stays
 *  resident once read (MOELITE_MODEL_EXPERTS_ALL_FIT = 1). The model loads as with a budget: the
 *  file is not mapped, dense weights are read into memory, experts are read on demand; results are
 *  bitwise those of a resident load. After loading, MOELITE_MODEL_EXPERT_BUDGET is the chosen
 *  budget and MOELITE_MODEL_BUDGET_AUTO_* give the terms of the sum.
 *  Replaces an earlier moelite_model_params_set_expert_budget (the last call wins).
 *  Errors: MOELITE_ERR_INVALID_ARGUMENT for NULL params or headroom_bytes above
 *  MOELITE_MAX_BUDGET_HEADROOM; at load, MOELITE_ERR_BUDGET_TOO_SMALL when the budget would be below
 *  the store's minimum working set (top-k + 1 expert slots), with every term in the message.
 *  Parameter objects are not thread-safe (see the top of this header). */
MOELITE_API moelite_status moelite_model_params_set_expert_budget_auto(moelite_model_params* params,
                                                                       uint64_t headroom_bytes);
/** The expert budget as a share of the routed experts: `fraction` of them get a slot (rounded up),
 *  beside the store's reserve slot (one per pool), decided at load. In bytes that is `fraction` of
 *  what keeping every expert in memory takes (MOELITE_MODEL_EXPERT_BYTES plus the slots' alignment
 *  and the reserve): 1.0 gives every expert a slot (all stay resident once read), 0.25 holds a
 *  quarter of them. The same share gives the same slots from every tool and binding ("25%" in
 *  moelite_model_params_set_expert_budget_text, the CLI's and the server's --budget). A share
 *  whose slots are below the minimum working set fails the load with MOELITE_ERR_BUDGET_TOO_SMALL
 *  (MOELITE_MODEL_EXPERT_MIN_BUDGET of moelite_model_inspect is that minimum). Replaces an earlier
 *  budget setting (the last call wins).
 *  MOELITE_ERR_INVALID_ARGUMENT unless 0 < fraction <= 1 (NaN included). */
MOELITE_API moelite_status moelite_model_params_set_expert_budget_fraction(moelite_model_params* params,
                                                                           double fraction);
/** The expert budget as a user writes it, parsed here so that every tool and binding reads the same
 *  spelling the same way:
 *    "2GiB", "512MiB", "1.5G", "123456"   bytes (moelite_parse_size)   = set_expert_budget
 *    "25%"                                a share of the experts        = set_expert_budget_fraction(0.25)
 *    "auto"                               sized at load                 = set_expert_budget_auto(0)
 *    "none"                               every expert resident         = set_expert_budget(0)
 *  Replaces an earlier budget setting (the last call wins). MOELITE_ERR_INVALID_ARGUMENT for NULL
 *  or any other text ("0" included: a budget computed as zero must not silently mean "none"), with
 *  what was expected in moelite_last_error(). */
MOELITE_API moelite_status moelite_model_params_set_expert_budget_text(moelite_model_params* params, const char* text);
/** A size in bytes as moelite's tools spell it: digits with an optional fraction and unit (B,
 *  K/KB = 1000, KiB = 1024, M/MB, MiB, G/GB, GiB, T/TB, TiB), e.g. "2GiB", "1.5G", "123456".
 *  MOELITE_ERR_INVALID_ARGUMENT for NULL, other text, below one byte or above 2^62 bytes. */
MOELITE_API moelite_status moelite_parse_size(const char* text, uint64_t* out_bytes);
/** Replacement policy of the expert store: "cyclic" (default: evict the expert whose next use is
 *  expected furthest ahead -- an evaluation visits the layers in a cycle, so an expert can next be
 *  wanted at its layer's next turn, and how likely it is wanted then comes from how often it was
 *  used lately; where one step wants more experts than the cache holds, as several sequences
 *  under a small budget do, LRU would evict exactly those the next step wants first and hit
 *  nothing), "lru", "lfu", "decay" (decayed frequency),
 *  "static" (a hot set: the profile's most used experts; without a profile, the most used so
 *  far) or "belady" (evict the expert needed furthest ahead, as far as predictions reveal; without
 *  a predictor, LRU among the unknown). The string is copied.
 *  MOELITE_ERR_INVALID_ARGUMENT for NULL or an unknown name. */
MOELITE_API moelite_status moelite_model_params_set_cache_policy(moelite_model_params* params, const char* policy);
MOELITE_DEPRECATED("moelite_model_params_set_cache_policy")
MOELITE_API moelite_status moelite_model_params_set_expert_policy(moelite_model_params* params, const char* policy);
/** Expert prediction feeding the store's prefetch queue (used with a budget; loads then overlap
 *  computation). Only speeds up loading: results are unchanged. The string is copied. An unknown
 *  name is refused here (MOELITE_ERR_INVALID_ARGUMENT); one whose requirements are missing fails at
 *  load: MOELITE_ERR_BAD_PROFILE without the profile it needs, MOELITE_ERR_INVALID_ARGUMENT for
 *  "pregate" on a model without pre-gate routers.
 *   "none"        (default) no prediction;
 *   "next-gate"   layers l+1 .. l+depth's routers applied to layer l's hidden state (see
 *                 moelite_model_params_set_predictor_depth); no profile needed;
 *   "first-layer" the next token's layer-0 experts from the current token's final hidden state,
 *                 by a linear map fitted by calibration (needs a profile);
 *   "learned"     per-layer linear maps fitted by calibration, predicting `stride` layers ahead
 *                 (ProMoE; needs a profile);
 *   "correlation" a co-activation table of consecutive layers (Klotski), seeded by a profile when
 *                 one is given and updated online;
 *   "pregate"     the exact next-layer routing of models with pre-gate routers
 *                 (blk.N.ffn_pregate_inp.weight; Pre-gated MoE, Read-ME).
 *  Several names separated by commas ("learned,first-layer") combine their guesses. Guesses are
 *  made in decode-sized evaluations only: at most 4 tokens per sequence (a step of several
 *  sequences decoding together, one token each, is one); a prefill needs most experts anyway.
 *  A guess never evicts another guess of the same prediction, so a step's guesses beyond the
 *  budget are left unread rather than read and thrown away. A guess of an expert not in memory is
 *  read only where the predictor's guesses of about its confidence have been used at least 60 % of
 *  the time so far (the store learns this as it runs; MOELITE_PREDICT_MIN_PRECISION changes the
 *  share): a wrong guess costs a read and the eviction of an expert that might have been used. */
MOELITE_API moelite_status moelite_model_params_set_predictor(moelite_model_params* params, const char* predictor);
MOELITE_DEPRECATED("moelite_model_params_set_predictor")
MOELITE_API moelite_status moelite_model_params_set_expert_predictor(moelite_model_params* params,
                                                                     const char* predictor);
/** Layers ahead the "next-gate" predictor looks (>= 1, default 1). Guesses for a deeper layer are
 *  loaded only once every nearer guessed expert is resident, so they never delay nearer ones.
 *  MOELITE_ERR_INVALID_ARGUMENT for a value below 1. */
MOELITE_API moelite_status moelite_model_params_set_predictor_depth(moelite_model_params* params, int32_t depth);
/** A calibration profile written by moelite_calibrate / `moelite calibrate` (NULL or "" for
 *  none; the path is copied). With a profile and an expert budget the store's slots are divided
 *  among layers by a DP allocation over the profile's hit curves and predictor accuracy, the
 *  "static" policy keeps the profile's most used experts, and sensitivity gating and the learned
 *  predictors can be used. At load: MOELITE_ERR_FILE_NOT_FOUND if it cannot be opened,
 *  MOELITE_ERR_BAD_PROFILE if it is malformed or was made for another model. */
MOELITE_API moelite_status moelite_model_params_set_profile(moelite_model_params* params, const char* path);
/** Adaptive top-k gating. `mode`: "exact" (default: the model's own top-k; results never depend
 *  on the budget), "sensitivity" (AdapMoE: after top-k and renormalisation, the lowest-weight
 *  experts are dropped while (sum of dropped weights)^2 * S_l < threshold, S_l being layer l's
 *  sensitivity from the profile, which is then required unless a quality target governs the
 *  context), "cache-aware" (sensitivity gating in
 *  which an expert that is not resident in the expert store when its layer is routed -- one whose
 *  use would be a read from storage -- is dropped while that predicted loss is below
 *  threshold x penalty instead, see moelite_model_params_set_gating_penalty; needs the profile
 *  too) or "score" (drop experts whose weight is below threshold). All keep at least one expert
 *  (the highest-weight one) and rescale the kept weights to the sum of all k. Changes results
 *  (fewer experts computed and loaded); moelite_expert_stats counts the experts used.
 *  "cache-aware" results depend on the store's state, hence on the budget, policy, allocation,
 *  the earlier evaluations and how tokens are split into batches: an approximate mode. They are
 *  deterministic for a given sequence of evaluations without a predictor (with one, speculative
 *  loads land asynchronously and may change them). Without an expert budget every expert is
 *  resident and "cache-aware" gives the "sensitivity" results bit for bit.
 *  MOELITE_ERR_INVALID_ARGUMENT for an unknown mode or a negative or non-finite threshold; at
 *  moelite_context_create, MOELITE_ERR_BAD_PROFILE for "sensitivity" or "cache-aware" without a
 *  profile, unless the context has a quality target (moelite_context_params_set_quality_target),
 *  whose governor learns the sensitivities' scale instead. */
MOELITE_API moelite_status moelite_model_params_set_gating(moelite_model_params* params, const char* mode,
                                                           float threshold);
/** Cache-aware gating's penalty P >= 1 (default 4): a non-resident expert may be dropped at up to
 *  P times the predicted loss allowed for a resident one. The threshold prices predicted loss
 *  against the time dropping an expert saves, in units of one resident expert's computation t_c;
 *  dropping a non-resident one also saves its read t_r, so P = 1 + t_r / t_c. A decode step is
 *  memory bound, so t_r / t_c is about memory bandwidth over storage bandwidth: `moelite bench`
 *  reports 1 + dram_read_gb_s / storage_read_gb_s as suggested_gating_penalty. The default is a
 *  fixed factor (t_r = 3 t_c), not a measurement, so results do not depend on timing. P = 1 is
 *  sensitivity gating. Ignored by other modes. MOELITE_ERR_INVALID_ARGUMENT below 1 or not
 *  finite. */
MOELITE_API moelite_status moelite_model_params_set_gating_penalty(moelite_model_params* params, float penalty);
/** Cache-aware gating's substitution (after Skliar et al.'s cache-conditional experts), off (0)
 *  by default. With n > 0, each of a token's experts that is not resident -- other than its
 *  highest-weight one, never replaced -- is offered one stand-in: the best-ranked expert among the
 *  router's next n after its top-k that is resident and not yet used by the token, with its own
 *  router weight w_f (w_e is the replaced expert's weight, S_l the layer's sensitivity):
 *  - an expert cache-aware gating kept is replaced when (w_e - w_f)^2 * S_l < threshold x penalty
 *    (its read is saved for no more loss than dropping it was allowed to cost);
 *  - an expert it dropped is revived as the stand-in when (w_e^2 - (w_e - w_f)^2) * S_l >=
 *    threshold (the loss taken back is worth one resident computation).
 *  The kept weights are then rescaled to the sum of all k, as for dropping. So at a given
 *  perplexity a token keeps more experts and reads fewer (tools/cache_aware_report.py). Only
 *  softmax-routed layers with at most 64 experts per token (the candidates' weights come from the
 *  router's softmax); layers with sigmoid scores, expert groups, selection biases or a pre-gate
 *  keep plain cache-aware gating. n is capped at n_expert - k at load. Without a budget (every
 *  expert resident) nothing is substituted. Ignored by other modes. MOELITE_ERR_INVALID_ARGUMENT
 *  outside [0, 65536] or for NULL params. */
MOELITE_API moelite_status moelite_model_params_set_gating_substitutes(moelite_model_params* params, int32_t n);
/** Deprecated: 1 is moelite_model_params_set_cache_allocation(params, "uniform"), 0 undoes that
 *  (one shared pool). */
MOELITE_DEPRECATED("moelite_model_params_set_cache_allocation(params, \"uniform\")")
MOELITE_API moelite_status moelite_model_params_set_expert_per_layer(moelite_model_params* params, int32_t per_layer);
/** How the expert budget's slots are divided among layers (the string is copied; an unknown name
 *  is refused here with MOELITE_ERR_INVALID_ARGUMENT):
 *   "auto"    (default) "dp" when a profile is set and the budget holds every layer's minimum
 *             (top-k + 1 slots), else "global" ("uniform" if set_expert_per_layer(1) was called);
 *   "global"  one pool shared by all layers;
 *   "uniform" equal per-layer quotas;
 *   "dp"      per-layer quotas minimising the expected on-demand loads per token, from the
 *             profile's measured hit curves and the chosen predictor's accuracy (a knapsack
 *             solved exactly by dynamic programming). Needs a profile (MOELITE_ERR_BAD_PROFILE)
 *             and a budget of top-k + 1 slots per layer (MOELITE_ERR_BUDGET_TOO_SMALL). */
MOELITE_API moelite_status moelite_model_params_set_cache_allocation(moelite_model_params* params,
                                                                     const char* allocation);
/** 1 (default): map the file and compute on the mapping. 0: read weights into owned memory.
 *  With an expert budget the file is never mapped, whatever this says: experts are read into
 *  the store's slots and the dense weights into owned memory.
 *
 *  On the CPU backend, mapped weights of a type with a faster layout of the backend's own (Q4_K
 *  and Q5_K on x86 with AVX2: rows interleaved by eight) are copied into that layout -- the routed experts
 *  at load, when all of them fit in the memory free at that moment with a quarter to spare, the
 *  dense weights on first use -- and their mapped pages are released, so memory use stays about
 *  the same (+3 %) but is the process's own rather than page cache; loading takes longer (about
 *  1.7 s per GB on two Zen 3 cores). The logits are the same bits either way. The environment
 *  variable MOELITE_GROUPED_ROWS=0 turns the copies off.
 *
 *  A model file that is truncated or rewritten while it is loaded: reading past its new end is
 *  reported, never a crash. Without a mapping (use_mmap 0, or an expert budget) every read of the
 *  file -- expert loads, and weights read at load -- checks its length, and moelite_eval returns
 *  MOELITE_ERR_IO with a message naming the file and offset; the context keeps its sequence.
 *  With a mapping (the default without a budget), touching a mapped page beyond the file's new
 *  end raises SIGBUS at the OS level; moelite does not install signal handlers (they belong to
 *  the application), so such a process is killed. Applications that cannot rule out a file
 *  changing underneath them set use_mmap 0 (CLI: --no-mmap) or a budget. Rewriting a mapped file
 *  in place changes the weights silently; replace files by renaming a new one over them. */
MOELITE_API moelite_status moelite_model_params_set_use_mmap(moelite_model_params* params, int32_t use_mmap);
/** 1: load only the tokenizer (no weights, no backend): tokenize/detokenize/chat formatting work,
 *  contexts cannot be created (MOELITE_ERR_INVALID_ARGUMENT). Vocabulary-only GGUF files, which
 *  hold tokenizer metadata and no tensors, can only be opened this way. Default 0. */
MOELITE_API moelite_status moelite_model_params_set_vocab_only(moelite_model_params* params, int32_t vocab_only);
/** Progress callback (NULL to remove) and the pointer handed back to it. */
MOELITE_API moelite_status moelite_model_params_set_progress_callback(moelite_model_params* params,
                                                                      moelite_progress_fn fn, void* user_data);
/** The chat template to use instead of the file's tokenizer.chat_template: a family name
 *  ("chatml", "mistral", "llama3", "tulu", "harmony", "deepseek2", "deepseek3", "plain") or a template source
 *  (Jinja, as in GGUF files)
 *  whose family moelite recognises by its markers; moelite formats every family natively and
 *  runs no Jinja. NULL or "" restores the file's template. The string is copied.
 *  MOELITE_ERR_INVALID_ARGUMENT when the text is neither a family name nor a recognised source. */
MOELITE_API moelite_status moelite_model_params_set_chat_template(moelite_model_params* params, const char* chat_template);

/* Limits. Every count a model file controls is checked before anything is sized from it, in
 * 64-bit arithmetic; a file beyond a limit is refused with MOELITE_ERR_BAD_METADATA (a key) or
 * MOELITE_ERR_BAD_SHAPE (a tensor) and a message naming the field and the limit. The limits
 * leave a wide margin over real models (largest known in brackets):
 *   layers (block_count)                 MOELITE_MAX_LAYERS        [94, Qwen3-235B-A22B]
 *   routed experts per layer             MOELITE_MAX_EXPERTS       [512, Qwen3-Next]
 *   experts used per token (top-k)       1 .. expert_count         [10, Qwen3-Next]
 *   embedding width, feed-forward widths MOELITE_MAX_WIDTH         [7168 / 18432, DeepSeek-V3]
 *   attention heads (query and kv)       MOELITE_MAX_HEADS         [128, DeepSeek-V3]
 *   head dimension (key and value)       MOELITE_MAX_HEAD_DIM      [576, MLA]
 *   training context length              MOELITE_MAX_CONTEXT       [1M]
 *   vocabulary (tokens, embedding rows)  MOELITE_MAX_VOCAB         [262144, Gemma 3]
 *   BPE merges                           MOELITE_MAX_VOCAB
 * In the GGUF header itself no string or array is allocated ahead of the bytes that hold it: a
 * length or count must fit in the rest of the file (and be below 2^40). Calibration profiles
 * take the same layer, expert and width limits (MOELITE_ERR_BAD_PROFILE), and their weight
 * tensors must fit, together, in the weights file. */
#define MOELITE_MAX_LAYERS 1024
#define MOELITE_MAX_EXPERTS 4096
#define MOELITE_MAX_WIDTH 262144
#define MOELITE_MAX_HEADS 1024
#define MOELITE_MAX_HEAD_DIM 4096
#define MOELITE_MAX_CONTEXT 16777216
#define MOELITE_MAX_VOCAB 16777216

/** Loads the GGUF model at `path`. `params` may be NULL for the defaults; it is only read
 *  during the call. On success *out_model receives a model the caller frees with
 *  moelite_model_free(). Every malformed or unsupported input gets its specific status (see
 *  moelite_status); nothing is leaked on failure. */
MOELITE_API moelite_status moelite_model_load(const char* path, const moelite_model_params* params,
                                              moelite_model** out_model);

/** Reads what a model file is without loading it: the header, the metadata and the tokenizer
 *  are read and the tensors checked against the architecture (every status of moelite_model_load
 *  for a bad file), but no weight is read, no backend is created and no budget applies. The
 *  result answers moelite_model_get (sizes, MOELITE_MODEL_EXPERT_MIN_BUDGET, the hyperparameters;
 *  the runtime keys THREADS, EXPERT_BUDGET, EXPERT_POOL_BYTES and the BUDGET_AUTO_* give 0 and
 *  BACKEND -1), the metadata getters, the token and
 *  chat functions; moelite_context_create refuses it (MOELITE_ERR_INVALID_ARGUMENT). Free it with
 *  moelite_model_free. Costs a map of the file, reading its metadata, building the tokenizer and
 *  touching the norm vectors of each layer: no more reads grow with the weights' size. */
MOELITE_API moelite_status moelite_model_inspect(const char* path, moelite_model** out_model);

/** Releases the caller's reference to a model. Contexts hold references of their own, so the
 *  contexts and the model may be freed in any order: the model's memory, threads and file are
 *  released when the last of them is freed (until then a context keeps working). The handle must
 *  not be used by the caller after this call, nor while it runs: calls on the model still running
 *  on other threads (moelite_tokenize, moelite_calibrate ...) must have returned first, since a
 *  freed handle cannot be told from a live one. NULL is a no-op. Thread-safe against concurrent
 *  moelite_context_free of its contexts. */
MOELITE_API void moelite_model_free(moelite_model* model);

/* ------------------------------------------------------------------------------------------ */
/* Model queries                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef enum moelite_model_key {
  MOELITE_MODEL_N_LAYERS = 0,
  MOELITE_MODEL_N_EXPERTS = 1,        /* routed experts per MoE layer */
  MOELITE_MODEL_N_EXPERTS_USED = 2,   /* top-k of the router */
  MOELITE_MODEL_N_SHARED_EXPERTS = 3, /* 0 or 1; deepseek2: expert_shared_count */
  MOELITE_MODEL_N_VOCAB = 4,
  MOELITE_MODEL_N_EMBD = 5,
  MOELITE_MODEL_N_HEAD = 6,
  MOELITE_MODEL_N_HEAD_KV = 7,
  MOELITE_MODEL_HEAD_DIM = 8,
  MOELITE_MODEL_N_FF_EXPERT = 9,
  MOELITE_MODEL_N_FF_SHARED = 10,
  MOELITE_MODEL_N_CTX_TRAIN = 11,
  MOELITE_MODEL_EXPERT_BYTES = 12,      /* bytes of all routed-expert weights */
  MOELITE_MODEL_DENSE_BYTES = 13,       /* bytes of every other weight */
  MOELITE_MODEL_N_PARAMS = 14,          /* total parameter count */
  MOELITE_MODEL_N_ACTIVE_PARAMS = 15,   /* parameters read for one token (top-k experts) */
  MOELITE_MODEL_THREADS = 16,           /* compute threads in use */
  MOELITE_MODEL_BACKEND = 17,           /* the moelite_backend actually chosen */
  MOELITE_MODEL_ACTIVE_BYTES = 18,      /* weight bytes read to compute one token: dense weights
                                           (one embedding row, not the table) plus top-k experts
                                           of average size in every layer */
  MOELITE_MODEL_EXPERT_BUDGET = 19,     /* the budget in use, set or chosen by budget auto (0: none,
                                           all resident in the file mapping) */
  MOELITE_MODEL_EXPERT_POOL_BYTES = 20, /* bytes of the expert slot pool (<= budget) */
  MOELITE_MODEL_EXPERT_PEAK_BYTES = 21, /* slot bytes that have held an expert so far */
  MOELITE_MODEL_EXPERT_SLOTS = 22,      /* experts the pool holds at once */
  MOELITE_MODEL_BUDGET_AUTO = 23,       /* 1 if the budget was sized by set_expert_budget_auto */
  MOELITE_MODEL_BUDGET_AUTO_ROOM = 24,  /* budget auto: bytes available when loading started
                                           (min of MemAvailable and the cgroup's room); else 0 */
  MOELITE_MODEL_BUDGET_AUTO_CONTEXT_BYTES = 25, /* budget auto: KV cache + scratch set aside */
  MOELITE_MODEL_BUDGET_AUTO_HEADROOM = 26,      /* budget auto: headroom set aside */
  MOELITE_MODEL_EXPERTS_ALL_FIT = 27,   /* 1 when every expert can be resident at once (no budget,
                                           or a pool with a slot for each); 0 when experts stream */
  MOELITE_MODEL_EXPERT_MIN_BUDGET = 28, /* the smallest expert budget this model loads with: the
                                           store's minimum working set (top-k + 1 expert slots; in
                                           every layer with per-layer pools). 0 vocabulary-only */
  MOELITE_MODEL_SLIDING_WINDOW = 29,    /* positions a sliding-window layer attends to (gpt-oss:
                                           attention.sliding_window); 0 without such layers */
  MOELITE_MODEL_N_WINDOWED_LAYERS = 30, /* layers that attend through that window; their KV cache
                                           holds window - 1 + n_batch positions, not n_ctx */
  MOELITE_MODEL_N_DENSE_LAYERS = 31,    /* leading layers with a dense FFN and no experts (deepseek2:
                                           leading_dense_block_count); they take no expert slots */
  MOELITE_MODEL_KV_BYTES_PER_TOKEN = 32 /* KV-cache bytes one position takes in all full-attention
                                           layers together: keys and values, or with multi-head
                                           latent attention (deepseek2) one shared latent + rope-key
                                           row per layer */
} moelite_model_key;

/** Value of a numeric property, or -1 if the key is unknown or the model is NULL. Thread-safe. */
MOELITE_API int64_t moelite_model_get(const moelite_model* model, moelite_model_key key);
/** general.architecture ("qwen3moe", ...); owned by the model. NULL for a NULL model. */
MOELITE_API const char* moelite_model_arch(const moelite_model* model);
/** general.name, or "" if absent; owned by the model. */
MOELITE_API const char* moelite_model_name(const moelite_model* model);
/** Name of the weight type that holds most expert bytes ("Q4_K", ...); owned by the library. */
MOELITE_API const char* moelite_model_expert_type(const moelite_model* model);
/** Name of the backend in use ("cpu", ...) with the SIMD level, e.g. "cpu (avx512)". */
MOELITE_API const char* moelite_model_backend_name(const moelite_model* model);

/** Metadata of the GGUF file (every key-value pair, tokenizer arrays included), in file order.
 *  moelite_model_meta_count: the number of pairs (0 for NULL). moelite_model_meta_key: the key of
 *  pair i, owned by the model, NULL when i is out of range. Thread-safe. */
MOELITE_API int32_t moelite_model_meta_count(const moelite_model* model);
MOELITE_API const char* moelite_model_meta_key(const moelite_model* model, int32_t i);
/** The value of metadata `key` as text into `buf` (room for `capacity` bytes, NUL-terminated):
 *  strings as stored, integers in decimal, floats with round-trip precision, booleans as "true" /
 *  "false", arrays as a JSON array (strings JSON-escaped). *len receives the text's length without
 *  the NUL. MOELITE_ERR_MISSING_METADATA when the key is absent; MOELITE_ERR_BUFFER_TOO_SMALL when
 *  length + 1 exceeds capacity (buf untouched, *len written; buf may be NULL with capacity 0 to
 *  ask the size). Thread-safe. */
MOELITE_API moelite_status moelite_model_meta_value(const moelite_model* model, const char* key, char* buf,
                                                    size_t capacity, size_t* len);

/** Measures the memory bandwidth of the device the model computes on, in GB/s (bytes read plus
 *  bytes written per second by copies within device memory; the best of five rounds of 256 MiB
 *  copies on a GPU), for benchmarks that relate decode speed to the device's bound. Takes about a
 *  second and briefly allocates twice 256 MiB of device memory. Waits for evaluations of the
 *  model's contexts to finish and blocks them meanwhile (thread-safe).
 *  Errors: MOELITE_ERR_INVALID_ARGUMENT (NULL model or out, vocabulary-only model),
 *  MOELITE_ERR_NOT_IMPLEMENTED when the backend computes in host memory (the CPU backend; measure
 *  DRAM bandwidth instead) or cannot measure, MOELITE_ERR_OUT_OF_MEMORY, MOELITE_ERR_BACKEND. */
MOELITE_API moelite_status moelite_model_measure_device_bandwidth(moelite_model* model, double* gb_per_s);

/** How fast the model's storage delivers experts read the way the expert store reads them under a
 *  budget: from the model file each expert as three reads (its gate, up and down matrices, widened
 *  to 4 KiB blocks where the file opens with O_DIRECT); from a packed expert file
 *  (moelite_pack_experts) each expert as one read of its record (three above 1 MiB); each loader
 *  thread (MOELITE_IO_THREADS, default 2) keeps its reads in flight as the store's demand reads:
 *  started in order, as many as fit in MOELITE_IO_BYTES_IN_FLIGHT (default 2 MiB; at least one, at
 *  most 12); through the store's reader (io_uring where available). The experts are random ones of
 *  random layers, the same for the same file. This is the speed a storage bound should divide by:
 *  large sequential reads (dd, most probes) can be much faster or slower than these. Set
 *  struct_size to sizeof(moelite_expert_read_probe); fields beyond it are not written. */
typedef struct moelite_expert_read_probe {
  size_t struct_size;
  double read_gb_per_s;     /* bytes landed per second, all loaders together */
  double reads_per_s;       /* read requests completed per second */
  double read_bytes;        /* mean bytes of a read request as issued */
  int32_t reads_in_flight;  /* the most at once, all loaders: loaders x the reads of the largest
                               size that fit the bytes in flight (at least 1, at most 12) */
  double copy_gb_per_s;     /* one DRAM copy of expert-sized pieces, where a copy follows the read
                               (buffered reads, an upload to a device) */
} moelite_expert_read_probe;
/*  Reads about `bytes` (0: 256 MiB; at least one submission per loader) and then copies 128 MiB;
 *  `model` may come from moelite_model_inspect (nothing is loaded) or moelite_model_load, and
 *  nothing of it changes; the reads compete with any evaluation running meanwhile. Buffers: one
 *  submission's experts per loader plus twice 128 MiB for the copy. Errors: MOELITE_ERR_INVALID_ARGUMENT (NULL
 *  model or out, struct_size unset, a model without routed experts), MOELITE_ERR_IO (a read
 *  failed), MOELITE_ERR_OUT_OF_MEMORY, MOELITE_ERR_SYSTEM_LIMIT (no thread). Thread-safe. */
MOELITE_API moelite_status moelite_model_measure_expert_reads(const moelite_model* model, uint64_t bytes,
                                                              moelite_expert_read_probe* out);

/** The packed expert file. Under a budget the expert store reads each expert it loads from the
 *  model file as three reads (its gate, up and down matrices are slices of three tensors), each
 *  widened to whole 4 KiB blocks with O_DIRECT. A packed expert file holds a copy of every routed
 *  expert with its three matrices together in one 4 KiB-aligned record, so an expert up to 1 MiB is
 *  one read with nothing widened: fewer, larger requests, which is what small experts on slow or
 *  latency-bound storage (eMMC, SD cards, UFS, network file systems) need. It is a sidecar: the
 *  GGUF is not changed and stays the model every tool (moelite too) loads.
 *
 *  Writes the packed expert file of the GGUF model at `model_path` to `out_path`, or, when
 *  `out_path` is NULL, beside the model as MODEL.experts (model_path + ".experts"), which is where
 *  moelite_model_load and moelite_model_inspect look for it. The file takes about the experts'
 *  bytes again. Written atomically: under a temporary name beside `out_path` that is renamed once
 *  whole, with the space reserved first (a disk too small fails at once); any failure removes it
 *  and leaves an older file at `out_path` as it was. `progress` (may be NULL) is called with the
 *  share of experts written; returning 0 cancels. Errors: MOELITE_ERR_INVALID_ARGUMENT (NULL path,
 *  `out_path` naming the model itself, a model without routed experts), the load errors of
 *  moelite_model_inspect for a file that is not a model this build runs, MOELITE_ERR_IO (a read or
 *  write failed, the disk is full, `out_path` is a directory or a special file),
 *  MOELITE_ERR_PROGRESS_ABORTED. Thread-safe. */
MOELITE_API moelite_status moelite_pack_experts(const char* model_path, const char* out_path,
                                                moelite_progress_fn progress, void* user_data);
/** The file the model's expert store reads experts from: the packed expert file beside the model
 *  when there is one made from this very model (its size, header, metadata, tensor directory and
 *  samples of every layer's experts are checked at load), else the model file. A packed file that
 *  is there but does not match (the model was replaced, the file was cut short) is not used, and
 *  the load logs a warning saying why; environment MOELITE_PACKED_EXPERTS=0 ignores it too. Results
 *  never depend on which file is read (the bytes are the same); only speed does. A model loaded
 *  without a budget maps its experts from the model file and names that. Owned by the model; NULL
 *  for a NULL model. */
MOELITE_API const char* moelite_model_expert_file(const moelite_model* model);

/** zstd on a sample of the model's experts, to decide whether compressing them could pay (the
 *  bytes it saves from storage against the time it takes to decompress): one row per weight type
 *  among the expert matrices. */
typedef struct moelite_expert_compression {
  const char* weight_type;    /* "Q8_0", "Q4_K", ...: static storage, owned by the library */
  int64_t matrices;           /* matrices compressed, one zstd frame each */
  uint64_t raw_bytes;         /* their bytes */
  uint64_t zstd_bytes;        /* compressed */
  double decompress_gb_per_s; /* raw bytes out per second of one thread decompressing */
} moelite_expert_compression;
/*  Compresses up to `max_experts` experts (0: 64) spread over the layers at zstd `level` (1..19; 0:
 *  3) and fills rows[0 .. min(capacity, n) - 1]; *n_rows receives n, the number of weight types (3
 *  at most: gate, up and down). MOELITE_ERR_BUFFER_TOO_SMALL when capacity < n (the first
 *  `capacity` rows are written). Errors: MOELITE_ERR_INVALID_ARGUMENT (NULL model or n_rows, rows
 *  NULL with capacity > 0, level or max_experts out of range, a vocabulary-only model),
 *  MOELITE_ERR_NOT_IMPLEMENTED (libzstd could not be loaded), MOELITE_ERR_IO,
 *  MOELITE_ERR_OUT_OF_MEMORY. Thread-safe. */
MOELITE_API moelite_status moelite_model_measure_expert_compression(const moelite_model* model, int32_t level,
                                                                    int32_t max_experts,
                                                                    moelite_expert_compression* rows, int32_t capacity,
                                                                    int32_t* n_rows);

/** Starts recording a timeline of this model's work to `path`, in the Chrome trace-event format
 *  (JSON that Perfetto, ui.perfetto.dev, and chrome://tracing open): every context's evaluations
 *  ("evaluate": tokens), each layer ("layer": layer; the time its routing and experts leave is
 *  attention, norms and dense FFNs), each MoE layer's routing ("route": layer, tokens, experts
 *  kept), each expert's computation ("expert": layer, expert, rows, time waited for its down
 *  projection, or "experts" for a resident layer at once) and each wait for a load ("wait for a
 *  load"), on the evaluating thread; and on the expert store's loader threads each read ("read":
 *  layer, expert, bytes, time queued before it started, speculative or not), with the prefetches
 *  issued, used, wasted and dropped as instants. The file is written by moelite_model_trace_end,
 *  or when the model is freed with a trace still running. Recording costs a clock read and an append per event; at most about
 *  two million events are kept (the file counts the rest as dropped_events).
 *  Errors: MOELITE_ERR_INVALID_ARGUMENT (NULL model or path, a vocabulary-only model, a trace
 *  already running), MOELITE_ERR_IO when `path` cannot be written (checked now, writing nothing,
 *  so a long run cannot lose its trace at the end). `path` is written as every moelite output is:
 *  a regular file replaced atomically keeping its mode, a symbolic link followed, a device or FIFO
 *  written into (a FIFO is not opened before the end, so a reader such as `cat` gets the whole
 *  trace). Thread-safe. */
MOELITE_API moelite_status moelite_model_trace_begin(moelite_model* model, const char* path);
/** Stops the trace and writes it (a regular file atomically: a reader never sees half a file).
 *  MOELITE_ERR_INVALID_ARGUMENT when no trace runs; MOELITE_ERR_IO when the file cannot be
 *  written (the trace is stopped either way). Thread-safe. */
MOELITE_API moelite_status moelite_model_trace_end(moelite_model* model);

/** Comma-separated list of the architectures this build supports; static storage. */
MOELITE_API const char* moelite_supported_archs(void);

/** Counters of the expert store (all zero when every expert is resident). Set struct_size to
 *  sizeof(moelite_expert_stats) (of the header the caller was built with): moelite writes only the
 *  fields that lie wholly within struct_size, so older callers keep working. */
typedef struct moelite_expert_stats {
  size_t struct_size;
  uint64_t activations; /* experts asked for by routing (one per expert and batch) */
  uint64_t hits;        /* ... that were resident or already loading */
  uint64_t misses;      /* ... that had to be loaded on demand */
  uint64_t prefetches_issued;
  uint64_t prefetches_used;
  uint64_t prefetches_wasted; /* speculative loads evicted or dropped before use */
  uint64_t bytes_read;        /* from storage */
  double wait_seconds;        /* time computation waited for loads */
  uint64_t predicted;         /* activations whose expert a predictor named beforehand; with
                                 activations: prediction accuracy */
  uint64_t predictions;       /* distinct experts predicted (precision = predicted / predictions) */
  uint64_t ready_when_needed; /* activations whose expert was fully loaded when computation asked
                                 for it (timeliness = ready_when_needed / activations) */
  uint64_t routed_tokens;     /* (token, layer) pairs routed, budget or not */
  uint64_t routed_experts;    /* experts they used after adaptive gating (= routed_tokens x top-k
                                 in exact mode) */
  double read_busy_seconds;   /* wall time with at least one storage read in flight, store-wide
                                 (layer -1 only; 0 in a layer's record): bytes_read over it is the
                                 read speed the store achieved while reading */
  uint64_t reads;             /* read requests to storage that landed (bytes_read / reads: their
                                 mean size); an expert is three from the model file, one from a
                                 packed expert file (moelite_pack_experts) */
} moelite_expert_stats;

/** Cumulative expert-store counters of one layer, or of all layers for layer = -1. Thread-safe.
 *  MOELITE_ERR_INVALID_ARGUMENT for a bad layer, a NULL out or a struct_size below sizeof(size_t). */
MOELITE_API moelite_status moelite_model_expert_stats(const moelite_model* model, int32_t layer,
                                                      moelite_expert_stats* out);
/** Zeroes the counters (e.g. between a warm-up and a measurement). */
MOELITE_API void moelite_model_reset_expert_stats(moelite_model* model);

/* ------------------------------------------------------------------------------------------ */
/* Platform: what this process runs on                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Read from /proc and /sys on Linux (Android included); fields this OS does not report are 0.
 * Every call reads afresh (memory changes; a few small files, microseconds), except where noted.
 * Thread-safe; needs no model. */
typedef enum moelite_platform_field {
  MOELITE_PLATFORM_MEM_TOTAL_BYTES = 0,     /* MemTotal */
  MOELITE_PLATFORM_MEM_AVAILABLE_BYTES = 1, /* what the process may still take: min(MemAvailable,
                                               cgroup limit - cgroup usage), the tightest cgroup
                                               (v1 or v2) from the process's own up to the root */
  MOELITE_PLATFORM_CGROUP_LIMIT_BYTES = 2,  /* that cgroup's limit; 0 when none */
  MOELITE_PLATFORM_CGROUP_USAGE_BYTES = 3,  /* that cgroup's usage (page cache included) */
  MOELITE_PLATFORM_IS_JETSON = 4,           /* 1 on NVIDIA Jetson (Tegra), else 0 */
  MOELITE_PLATFORM_UNIFIED_MEMORY = 5,      /* 1 when the GPU shares the CPU's DRAM (Jetson) */
  MOELITE_PLATFORM_CPUS_ONLINE = 6,         /* logical CPUs online */
  MOELITE_PLATFORM_CPUS_ALLOWED = 7,        /* ... of which this process may use (affinity) */
  MOELITE_PLATFORM_BIG_CORES = 8,           /* big cores among the allowed on a heterogeneous CPU
                                               (capacity more than 10 % above the slowest allowed
                                               CPU's: all but the little cluster); 0 when the
                                               allowed CPUs are alike */
  MOELITE_PLATFORM_DEFAULT_THREADS = 9,     /* threads a model uses by default */
  MOELITE_PLATFORM_AUTO_BACKEND = 10,       /* the moelite_backend that MOELITE_BACKEND_AUTO picks.
                                               The first call probes the GPUs (milliseconds to a
                                               second); later ones reuse the probe's verdict */
  MOELITE_PLATFORM_HAS_CUDA = 11,           /* 1 if this build contains the CUDA backend */
  MOELITE_PLATFORM_HAS_VULKAN = 12          /* 1 if this build contains the Vulkan backend */
} moelite_platform_field;

/** Value of a platform field; -1 for an unknown field. Thread-safe, never fails otherwise. */
MOELITE_API int64_t moelite_platform_get(moelite_platform_field field);

/** The platform as one JSON object, NUL-terminated, into `buf` (room for `buf_size` bytes):
 *  kind ("jetson", "linux-arm", "x86-desktop", "linux-other"), model (board or product name),
 *  tegra_release, unified_memory, cpu {model, arch, online, allowed, capacity per CPU id,
 *  big_cores, heterogeneous, default_threads}, memory {total, available (MemAvailable),
 *  cgroup_version, cgroup_limit, cgroup_usage, room (= MOELITE_PLATFORM_MEM_AVAILABLE_BYTES)},
 *  backends {cpu, cuda, vulkan: built in; cuda_emulator: the CUDA backend can run on its SIMT emulator (a development build)}, auto_backend {name, reason}. Byte counts are numbers.
 *  *needed (may be NULL) receives the size including the NUL. MOELITE_ERR_BUFFER_TOO_SMALL when
 *  buf_size is smaller (buf is then untouched; buf may be NULL with buf_size 0 to ask the size).
 *  The text can differ between calls (memory changes), so size the second call's buffer with
 *  some slack or loop. Thread-safe; probes GPUs like MOELITE_PLATFORM_AUTO_BACKEND. */
MOELITE_API moelite_status moelite_platform_describe_json(char* buf, size_t buf_size, size_t* needed);

/* ------------------------------------------------------------------------------------------ */
/* Calibration                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct moelite_calibrate_params moelite_calibrate_params;

/** Defaults: windows of 256 tokens, learned predictors 1 layer ahead, 25 % of the tokens held
 *  out of predictor fitting (their accuracy is measured there), finite-difference alpha 0.9, no
 *  progress callback. Returns NULL only when out of memory. */
MOELITE_API moelite_calibrate_params* moelite_calibrate_params_create(void);
MOELITE_API void moelite_calibrate_params_free(moelite_calibrate_params* params);
/** Tokens per evaluation window (>= 2); each window is evaluated from an empty cache. */
MOELITE_API moelite_status moelite_calibrate_params_set_window(moelite_calibrate_params* params, int32_t window);
/** Layers ahead the learned predictors look (>= 1). */
MOELITE_API moelite_status moelite_calibrate_params_set_stride(moelite_calibrate_params* params, int32_t stride);
/** Share of the tokens kept out of predictor fitting, in (0, 1). */
MOELITE_API moelite_status moelite_calibrate_params_set_holdout(moelite_calibrate_params* params, double share);
/** Tokens the sensitivity passes run on (the 2 x n_layers perturbed forward passes per window
 *  that measure S_l): whole windows evenly spread over the corpus, as many as cover `tokens`.
 *  -1 (the default): max(4096, 196608 / n_layers), which keeps those passes near 393216
 *  token-passes whatever the depth; 0: every window. Everything else uses every token. */
MOELITE_API moelite_status moelite_calibrate_params_set_sensitivity_tokens(moelite_calibrate_params* params,
                                                                           int64_t tokens);
/** Progress in [0, 1] after every forward pass, in proportion to the work (forward passes, then
 *  the fitting); returning 0 stops (MOELITE_ERR_PROGRESS_ABORTED). */
MOELITE_API moelite_status moelite_calibrate_params_set_progress_callback(moelite_calibrate_params* params,
                                                                          moelite_progress_fn fn, void* user_data);

/** Runs `model` over `n_tokens` tokens of a corpus and writes a calibration profile to
 *  `profile_path` (JSON, plus `profile_path`.bin with predictor weights): per-layer sensitivity
 *  S_l (the KL divergence of the output when each token's lowest-weight expert of layer l is
 *  dropped, over the squared dropped weight; also by a 10 % finite difference), expert use
 *  counts, experts per token under sensitivity gating at a grid of thresholds, per-layer LRU
 *  hit-rate curves against cache size, and the first-layer, learned and correlation predictors
 *  with every predictor's held-out accuracy per layer. Costs one forward pass per window, plus
 *  2 x n_layers more (and a KL divergence over the vocabulary each) on the windows of the
 *  sensitivity sample (moelite_calibrate_params_set_sensitivity_tokens), plus the ridge fits
 *  (O(n_embd^2) per captured token and layer, on the backend's threads). The model must have been loaded with exact gating, and no other context of it
 *  may evaluate meanwhile. `params` may be NULL. Existing files are replaced only once complete.
 *  Errors: MOELITE_ERR_INVALID_ARGUMENT (fewer than 2 tokens, non-exact gating), MOELITE_ERR_BAD_TOKEN
 *  (a token outside the vocabulary),
 *  MOELITE_ERR_IO (cannot write), MOELITE_ERR_PROGRESS_ABORTED, and evaluation errors. */
MOELITE_API moelite_status moelite_calibrate(moelite_model* model, const int32_t* tokens, int32_t n_tokens,
                                             const moelite_calibrate_params* params, const char* profile_path);

/* ------------------------------------------------------------------------------------------ */
/* Contexts: a KV cache plus the scratch memory of one inference stream                         */
/* ------------------------------------------------------------------------------------------ */

typedef struct moelite_context moelite_context;
typedef struct moelite_context_params moelite_context_params;

/** Polled between layers during evaluation, and every 10 ms while the evaluation waits: for
 *  another context of the same model to finish its evaluation (when contexts take turns, see
 *  Threads at the top),
 *  or for expert reads from storage (with a budget). Return non-zero to abort: moelite_eval then
 *  returns MOELITE_ERR_ABORTED and the context keeps its sequence. Runs on the calling thread of
 *  moelite_eval. A read that does not complete within the I/O timeout
 *  (environment MOELITE_IO_TIMEOUT, seconds, default 120) fails the evaluation with MOELITE_ERR_IO. */
typedef int (*moelite_abort_fn)(void* user_data);

/** Defaults: n_ctx = min(model's training context, 4096), n_batch = 512, no abort callback.
 *  Returns NULL only when out of memory. */
MOELITE_API moelite_context_params* moelite_context_params_create(void);
MOELITE_API void moelite_context_params_free(moelite_context_params* params);
/** Maximum tokens the KV cache holds, 1..MOELITE_MAX_CONTEXT; 0 restores the default.
 *  MOELITE_ERR_INVALID_ARGUMENT outside that range; a cache the memory cannot hold makes
 *  moelite_context_create fail with MOELITE_ERR_OUT_OF_MEMORY. */
MOELITE_API moelite_status moelite_context_params_set_n_ctx(moelite_context_params* params, int32_t n_ctx);
/** Largest number of tokens computed in one forward pass (>= 1); longer inputs to moelite_eval
 *  are split. Scratch memory grows with it. */
MOELITE_API moelite_status moelite_context_params_set_n_batch(moelite_context_params* params, int32_t n_batch);

/** Most sequences one context holds (moelite_context_params_set_n_seq). */
#define MOELITE_MAX_SEQUENCES 256
/** Sequences the context holds, 1..MOELITE_MAX_SEQUENCES (default 1). Each sequence has its own
 *  KV cache of n_ctx positions, allocated at creation (moelite_context_kv_bytes counts them all,
 *  and budget "auto" sets them aside), so memory grows linearly with n_seq.
 *  moelite_eval_batch evaluates tokens of several sequences in one pass; the other functions of
 *  a context act on sequence 0. MOELITE_ERR_INVALID_ARGUMENT outside the range. */
MOELITE_API moelite_status moelite_context_params_set_n_seq(moelite_context_params* params, int32_t n_seq);
MOELITE_API moelite_status moelite_context_params_set_abort_callback(moelite_context_params* params,
                                                                     moelite_abort_fn fn, void* user_data);

/** Observes routing: called once per MoE layer of every forward pass with the experts chosen for
 *  the batch's `n_tokens` tokens (sequence positions pos0 .. pos0 + n_tokens - 1; in a pass of
 *  moelite_eval_batch the rows are its tokens ordered by sequence id, each sequence's in the order
 *  given, cut into passes of at most n_batch rows, and pos0 is the first row's position):
 *  experts[t * k + j] with weights[t * k + j] for slot j of token t, in top-k order, weights as
 *  applied (after renormalisation and adaptive gating; a slot dropped by adaptive gating has
 *  expert -1 and weight 0). The arrays are valid during the call only. Runs on the
 *  thread calling moelite_eval; for traces, profiling and calibration. It must not create, free,
 *  evaluate or save contexts of the same model: where contexts take turns those wait for the
 *  evaluation that is calling it. */
typedef void (*moelite_routing_fn)(int32_t layer, int32_t pos0, int32_t n_tokens, int32_t k, const int32_t* experts,
                                   const float* weights, void* user_data);
MOELITE_API moelite_status moelite_context_params_set_routing_callback(moelite_context_params* params,
                                                                       moelite_routing_fn fn, void* user_data);

/** The quality meter, for lossy gating (moelite_model_params_set_gating other than "exact"):
 *  on a share `sample_rate` in [0, 1] of the decode steps (0: off, the default), the context
 *  evaluates the step's tokens a second time with exact routing over the same history and compares
 *  the two next-token distributions (KL divergence, agreement of the most likely token); see
 *  moelite_context_quality_stats. Which steps are sampled is a hash of the sequence, the position
 *  and the count of tokens the context evaluated before: the same inputs meter the same tokens,
 *  whatever the timing. A metered step costs one more
 *  evaluation, reading the experts exact routing needs; the context keeps the gated results (the
 *  exact pass's cache rows are put back), though under a budget the experts it read stay in the
 *  cache like any others. Steps of prompt prefill are not metered. MOELITE_ERR_INVALID_ARGUMENT
 *  outside [0, 1] or NaN. */
MOELITE_API moelite_status moelite_context_params_set_quality_meter(moelite_context_params* params,
                                                                    double sample_rate);
/** The quality governor: the context moves its gating threshold, step by step, to hold what gating
 *  costs at `target`: "1%" or "0.5%" (a perplexity rise, taken as a KL of ln(1 + rise) per token:
 *  the cross-entropy's expected growth when text follows the exact model) or "kl:0.01" (nats per
 *  token); NULL or "" for none (the default). Needs "sensitivity" or "cache-aware" gating
 *  (moelite_context_create: MOELITE_ERR_INVALID_ARGUMENT otherwise); the model's profile is then
 *  optional: without one every layer's sensitivity starts at 1 and the governor learns their
 *  scale from the quality meter, starting from (almost) exact routing; with one it starts from the
 *  model's threshold. The meter samples one decode step in eight unless
 *  moelite_context_params_set_quality_meter says otherwise. The trajectory depends on the inputs,
 *  the parameters and the sampled positions only, never on timing (with a predictor and a budget
 *  too; cache-aware gating excepted, whose choices read what the store holds).
 *  MOELITE_ERR_INVALID_ARGUMENT for a target that does not parse or lies outside (0 %, 100 %] or
 *  (0, 10] nats. */
MOELITE_API moelite_status moelite_context_params_set_quality_target(moelite_context_params* params,
                                                                     const char* target);
/** The thresholds the governor may use, min >= 0, max >= min (default [0, 1e30]).
 *  MOELITE_ERR_INVALID_ARGUMENT otherwise. */
MOELITE_API moelite_status moelite_context_params_set_quality_bounds(moelite_context_params* params,
                                                                     double min_threshold, double max_threshold);

/** What lossy gating cost this context so far, measured and predicted. Set struct_size to
 *  sizeof(moelite_quality_stats); fields beyond it are not written. Every field is 0 with exact
 *  gating. */
typedef struct moelite_quality_stats {
  size_t struct_size;
  uint64_t gated_tokens;          /* tokens evaluated with lossy gating */
  double predicted_loss;          /* the sensitivity model's loss per token (sum over layers of
                                     S_l x (weight of the router's experts left out)^2; 0 in "score"
                                     mode, which has no sensitivities) */
  uint64_t metered_tokens;        /* next-token distributions compared with exact routing */
  double kl_mean;                 /* their mean KL(exact || gated), nats per token */
  double kl_stderr;               /* its standard error (sample standard deviation / sqrt(n)) */
  double top1_agreement;          /* share of them whose most likely token is the same */
  double top1_stderr;             /* its standard error, sqrt(a (1 - a) / n) */
  double predicted_loss_metered;  /* the predicted loss per token of the metered tokens alone */
  uint64_t meter_evaluations;     /* exact passes run (one per metered step) */
  double meter_seconds;           /* their time, with saving and restoring the cache rows */
  double threshold;               /* the gating threshold in use now (the governor's, or the model's) */
  double target_kl;               /* the governor's target in nats per token (0: no governor) */
  double kl_per_predicted;        /* the governor's estimate of measured KL per unit of predicted loss */
} moelite_quality_stats;
/*  MOELITE_ERR_BUSY while another thread is inside a call on the context. */
MOELITE_API moelite_status moelite_context_quality_stats(const moelite_context* ctx, moelite_quality_stats* out);

/** Creates a context for `model`. The context holds a reference to the model (see
 *  moelite_model_free), so the model may be freed first. `params` may be NULL for defaults.
 *  Free with moelite_context_free(). */
MOELITE_API moelite_status moelite_context_create(moelite_model* model, const moelite_context_params* params,
                                                  moelite_context** out_ctx);
MOELITE_API void moelite_context_free(moelite_context* ctx);

/* ---- Batch planning: how many sequences, and how much memory for experts ------------------- */

/** Under a memory limit, every sequence's KV cache (n_ctx positions, allocated when the context is
 *  made) is memory the expert cache does not get. More sequences share each expert read, a smaller
 *  cache misses more. moelite_plan_batch predicts the aggregate decode throughput of 1..max
 *  sequences from the model's shape, the memory and the measured bandwidths, and picks the fewest
 *  sequences within 5 % of the best (the model is in docs/ARCHITECTURE.md, "Batch planner": routing
 *  uniform unless a profile gives it, LRU replacement, reads not overlapped with computation). Use the plan by
 *  loading the model with moelite_model_params_set_expert_budget(MOELITE_PLAN_EXPERT_BUDGET) and
 *  the plan's cache allocation (moelite_batch_plan_allocation), and creating the context with
 *  moelite_context_params_set_n_seq(MOELITE_PLAN_N_SEQ); a lookahead of 1 suggests a predictor one
 *  layer ahead (moelite_model_params_set_predictor "next-gate"), 0 none.
 *  Parameter objects are not thread-safe; a plan is immutable and may be read from any thread. */
typedef struct moelite_plan_params moelite_plan_params;
typedef struct moelite_batch_plan moelite_batch_plan;

/** moelite_plan_params_set_expert_budget: the planner sizes the budget (the default). */
#define MOELITE_PLAN_BUDGET_AUTO ((uint64_t)0)
/** moelite_plan_params_set_expert_budget: no budget; the weights are a file mapping (the page
 *  cache's memory, not counted against the limit), so only the KV caches and scratch are. */
#define MOELITE_PLAN_RESIDENT (~(uint64_t)0)

/** Defaults: at most 16 sequences, memory = the room now (MOELITE_PLATFORM_MEM_AVAILABLE_BYTES),
 *  budget auto's default headroom, the budget sized by the planner, no bandwidths. NULL when out
 *  of memory. Free with moelite_plan_params_free (NULL is ignored). */
MOELITE_API moelite_plan_params* moelite_plan_params_create(void);
MOELITE_API void moelite_plan_params_free(moelite_plan_params* params);
/** Sequences to consider, 1..MOELITE_MAX_SEQUENCES (e.g. the requests waiting). */
MOELITE_API moelite_status moelite_plan_params_set_max_sequences(moelite_plan_params* params, int32_t n);
/** The fewest sequences to consider, 1..MOELITE_MAX_SEQUENCES (default 1). Equal to the maximum,
 *  the plan is for exactly that many: its budget and pools. moelite_plan_batch answers
 *  MOELITE_ERR_INVALID_ARGUMENT when it exceeds the maximum. */
MOELITE_API moelite_status moelite_plan_params_set_min_sequences(moelite_plan_params* params, int32_t n);
/** Bytes the dense weights, the expert cache, the contexts and the headroom must fit in together
 *  (at most 2^62); 0: the room now. */
MOELITE_API moelite_status moelite_plan_params_set_memory(moelite_plan_params* params, uint64_t bytes);
/** Memory kept out of the plan for everything else (at most 2^62); 0: max(64 MiB, 10 % of memory),
 *  as budget auto. */
MOELITE_API moelite_status moelite_plan_params_set_headroom(moelite_plan_params* params, uint64_t bytes);
/** MOELITE_PLAN_BUDGET_AUTO, MOELITE_PLAN_RESIDENT, or a fixed expert budget in bytes (at most
 *  2^62; then only the sequences are planned). Ignored for a loaded model, whose budget is set. */
MOELITE_API moelite_status moelite_plan_params_set_expert_budget(moelite_plan_params* params, uint64_t bytes);
/** The same budget as text, spelled as for moelite_model_params_set_expert_budget_text: "auto"
 *  (the planner sizes it), "none" (resident), bytes ("2GiB"), or a share of the experts ("25%"),
 *  which becomes the bytes a load with that share takes. MOELITE_ERR_INVALID_ARGUMENT for other
 *  text. Ignored for a loaded model, whose budget is set. */
MOELITE_API moelite_status moelite_plan_params_set_expert_budget_text(moelite_plan_params* params, const char* text);
/** The expert pools the plan may use: "auto" (default: one global pool where a decode step's
 *  experts fit in it, else a pool per layer, which the plan then names), "global", or "uniform" /
 *  "dp" (per-layer pools). Ignored for a loaded model, whose pools are set. The string is read
 *  during the call. MOELITE_ERR_INVALID_ARGUMENT for NULL or another name. */
MOELITE_API moelite_status moelite_plan_params_set_cache_allocation(moelite_plan_params* params, const char* allocation);
/** A calibration profile (moelite_calibrate) whose expert counts give each expert's share of
 *  tokens: skewed routing lets a cache hit more often than its share of the experts, most of all
 *  for few sequences. NULL or "" (default): a loaded model's own profile if it has one, else
 *  routing taken as uniform. Read by moelite_plan_batch, which answers MOELITE_ERR_BAD_PROFILE (or
 *  the file's error) for a profile of another model or a broken file. The string is copied. */
MOELITE_API moelite_status moelite_plan_params_set_profile(moelite_plan_params* params, const char* path);
/** A routing trace of one sequence (JSON lines as `moelite trace record` writes them) replayed
 *  instead of a profile's shares: each candidate n is n copies of the trace started evenly apart,
 *  each step reading the union of their experts through LRU, so a sequence's reuse of its recent
 *  experts (which shares and uniform routing miss) is measured, not assumed. Record it on text like
 *  the requests to come. NULL or "" (default): none. Read by moelite_plan_batch (at most 1 GiB; at
 *  most the first 1024 steps replayed, fewer for big models or many candidates so that a plan
 *  takes seconds, not minutes), which answers MOELITE_ERR_FILE_NOT_FOUND / MOELITE_ERR_IO for a file
 *  it cannot read and MOELITE_ERR_INVALID_ARGUMENT for a malformed trace, one of another model
 *  (more layers or experts, a layer without experts) or one set together with a profile. The
 *  string is copied. */
MOELITE_API moelite_status moelite_plan_params_set_routing_trace(moelite_plan_params* params, const char* path);
/** The same as a routing trace, from memory: what moelite_context_params_set_routing_callback
 *  reported for `n_tokens` tokens of one sequence, in order. experts[(t * n_moe_layers + i) * k + j]
 *  is slot j of token t in the i-th layer with experts, model layer MOELITE_MODEL_N_DENSE_LAYERS + i
 *  (the callback's `layer` minus that); -1 for an empty slot (dropped by adaptive gating).
 *  n_moe_layers is MOELITE_MODEL_N_LAYERS - MOELITE_MODEL_N_DENSE_LAYERS and k at least the
 *  model's top-k for moelite_plan_batch to accept them (it answers MOELITE_ERR_INVALID_ARGUMENT
 *  for another shape or an expert id past the model's). The array is copied (n_tokens x
 *  n_moe_layers x k at most 2^28 ids, n_tokens >= 1, k <= 1024); setting it clears a trace path
 *  and setting a trace path (not NULL or "") clears it, so the last one set is used. NULL experts
 *  with n_tokens 0 clears it. MOELITE_ERR_INVALID_ARGUMENT for other sizes or ids below -1;
 *  MOELITE_ERR_OUT_OF_MEMORY when the copy cannot be made. */
#define MOELITE_MAX_PLAN_ROUTING_IDS ((int64_t)1 << 28)
MOELITE_API moelite_status moelite_plan_params_set_routing(moelite_plan_params* params, int32_t n_tokens,
                                                           int32_t n_moe_layers, int32_t k, const int32_t* experts);
/** Measured bandwidths in GB/s, each 0..10^6: reads from the model's storage (needed unless the
 *  plan is resident: `moelite info --storage`, or the store's own counters), and the weight bytes a
 *  decode step computes per second (0: not modelled; then the lookahead stays 0 and a resident
 *  plan takes the most sequences that fit). MOELITE_ERR_INVALID_ARGUMENT for NaN or out of range. */
MOELITE_API moelite_status moelite_plan_params_set_bandwidths(moelite_plan_params* params, double storage_gb_per_s,
                                                              double compute_gb_per_s);

/** Plans for `model`: one from moelite_model_inspect (the planner may size the budget) or a loaded
 *  one (its budget is kept; the part of its pool not yet touched is taken from the room, which
 *  does not show it yet). `context_params` gives n_ctx and n_batch (NULL: defaults; its n_seq is
 *  ignored); `params` may be NULL for defaults. Reads no weights, allocates only the plan.
 *  Errors: MOELITE_ERR_INVALID_ARGUMENT for NULL model or out, a vocabulary-only model, a model
 *  without routed experts, streaming without a storage bandwidth, or more sequences at least
 *  than at most; MOELITE_ERR_BUDGET_TOO_SMALL when not even the fewest sequences fit beside the
 *  minimum working set (every term in the message).
 *  On success *out_plan is freed with moelite_batch_plan_free; on failure it is NULL. */
MOELITE_API moelite_status moelite_plan_batch(const moelite_model* model, const moelite_context_params* context_params,
                                              const moelite_plan_params* params, moelite_batch_plan** out_plan);

typedef enum moelite_batch_plan_key {
  MOELITE_PLAN_N_SEQ = 0,          /* sequences to decode together */
  MOELITE_PLAN_EXPERT_BUDGET = 1,  /* bytes to load the model with (0: resident) */
  MOELITE_PLAN_KV_BYTES = 2,       /* the chosen sequences' KV caches together */
  MOELITE_PLAN_LOOKAHEAD = 3,      /* layers to predict ahead: 0 or 1 */
  MOELITE_PLAN_MEMORY = 4,         /* the memory planned within */
  MOELITE_PLAN_HEADROOM = 5        /* the headroom kept out of it */
} moelite_batch_plan_key;

/** A value of the plan, or -1 for NULL or an unknown key. */
MOELITE_API int64_t moelite_batch_plan_get(const moelite_batch_plan* plan, moelite_batch_plan_key key);
/** The predicted aggregate decode tokens/s of the chosen sequences (0 when nothing could be timed:
 *  resident without a compute rate). A model, not a measurement. */
MOELITE_API double moelite_batch_plan_decode_tok_s(const moelite_batch_plan* plan);
/** The pools the plan assumes: "global", "uniform" (one per layer; load with
 *  moelite_model_params_set_cache_allocation(params, "uniform")) or "none" (resident). The
 *  prediction for many sequences depends on it: one global LRU pool smaller than a step's experts
 *  hits nothing (layers visited in turn evict each other's experts before they are reused). Owned
 *  by the plan ("" for NULL). */
MOELITE_API const char* moelite_batch_plan_allocation(const moelite_batch_plan* plan);
/** One sentence: what bounded the choice. Owned by the plan ("" for NULL). */
MOELITE_API const char* moelite_batch_plan_reason(const moelite_batch_plan* plan);
/** The plan as one JSON object: the inputs, the choice, the reason and a row per candidate
 *  (n_seq, fits, kv_bytes, expert_budget_bytes, allocation, cache_share, hit_share, distinct_experts_per_layer,
 *  read_bytes_per_step, step_seconds, decode_tok_s). Owned by the plan ("" for NULL). */
MOELITE_API const char* moelite_batch_plan_json(const moelite_batch_plan* plan);
MOELITE_API void moelite_batch_plan_free(moelite_batch_plan* plan);

/** Replaces the context's abort callback (NULL removes it); see moelite_abort_fn. Must not be
 *  called while the context evaluates (the one-thread-at-a-time rule of contexts): the callback
 *  itself is how another thread stops an evaluation. MOELITE_ERR_INVALID_ARGUMENT for NULL ctx. */
MOELITE_API moelite_status moelite_context_set_abort_callback(moelite_context* ctx, moelite_abort_fn fn,
                                                              void* user_data);

/** Appends `n_tokens` tokens to the sequence and runs the model on them.
 *  `logits_all` non-zero keeps the logits of every token of this call, zero only the last one's.
 *  Errors: MOELITE_ERR_BAD_TOKEN, MOELITE_ERR_CONTEXT_FULL (nothing is evaluated), I/O errors
 *  from the expert store, MOELITE_ERR_ABORTED. After any error the context is as it was before
 *  the call (the sequence length is unchanged, the logits of the previous call still readable),
 *  so the caller can retry or go on. One exception: on a model with sliding-window layers, a call
 *  that fails after its first batch may have moved the window's ring past the old sequence, which
 *  is then forgotten (kv_length 0; the logits stay readable). */
MOELITE_API moelite_status moelite_eval(moelite_context* ctx, const int32_t* tokens, int32_t n_tokens,
                                        int32_t logits_all);

/** Evaluates tokens of several sequences in one forward pass: token i is appended to sequence
 *  seq_ids[i] (0 <= id < n_seq; NULL puts every token in sequence 0), at the position after that
 *  sequence's tokens so far; a sequence's tokens are taken in the order given, and tokens of
 *  different sequences may be interleaved in any way. `want_logits[i]` non-zero keeps token i's
 *  logits; NULL keeps those of the last token of each sequence named in the batch.
 *
 *  What it is for: the tokens of all sequences share each layer's matrix products, and each
 *  routed expert is read (from storage, with a budget) and applied once per layer for all tokens
 *  routed to it, so decoding n sequences together costs far less than n separate evaluations.
 *  Exact: each sequence's logits are bitwise those of evaluating it alone (attention stays within
 *  a sequence; every other operation computes a token the same way in any batch), unless
 *  cache-aware adaptive gating is on (its choices depend on what is resident).
 *
 *  Errors: MOELITE_ERR_BAD_TOKEN, MOELITE_ERR_INVALID_ARGUMENT (a sequence id out of range, or
 *  n_tokens < 1), MOELITE_ERR_CONTEXT_FULL (a sequence's tokens do not fit its cache; nothing is
 *  evaluated), and everything moelite_eval reports. After any error every sequence is as it was
 *  before the call (with sliding-window layers, see moelite_eval). Logits: moelite_get_logits(ctx,
 *  i) with i the index in this batch. Thread-safety: as moelite_eval. */
MOELITE_API moelite_status moelite_eval_batch(moelite_context* ctx, const int32_t* tokens, const int32_t* seq_ids,
                                              const uint8_t* want_logits, int32_t n_tokens);

/** Logits (n_vocab floats) of token `i` of the last successful evaluation. After moelite_eval:
 *  with logits_all, 0 <= i < n_tokens; otherwise only the last token's (i = 0 or -1). After
 *  moelite_eval_batch: token i of the batch, NULL unless its logits were wanted. Negative i counts
 *  from the end.
 *  Returns NULL for an index that has no logits. Owned by the context; valid until the next
 *  moelite_eval, moelite_generate, moelite_generate_tokens, moelite_context_kv_reset /
 *  _kv_truncate or moelite_context_free on it (after a generation call they are those of its last
 *  evaluation). */
MOELITE_API const float* moelite_get_logits(const moelite_context* ctx, int32_t i);

/** The model `ctx` evaluates (NULL for NULL). Borrowed: valid while the context lives, even after
 *  the application's moelite_model_free (the context holds a reference); not to be freed. */
MOELITE_API moelite_model* moelite_context_model(const moelite_context* ctx);
/** Tokens currently held in the KV cache (0 for NULL). */
MOELITE_API int32_t moelite_context_kv_length(const moelite_context* ctx);
/** Context length chosen at creation (0 for NULL). */
MOELITE_API int32_t moelite_context_n_ctx(const moelite_context* ctx);
/** Bytes of the context's KV cache, keys and values of every layer, allocated at creation and
 *  fixed for its life (0 for NULL). Full-attention layers hold n_ctx positions; sliding-window
 *  layers (MOELITE_MODEL_N_WINDOWED_LAYERS) only their window plus one batch. */
MOELITE_API uint64_t moelite_context_kv_bytes(const moelite_context* ctx);
/** Forgets the whole sequence. NULL is a no-op. */
MOELITE_API void moelite_context_kv_reset(moelite_context* ctx);
/** Keeps the first n_keep tokens and forgets the rest (n_keep clamped to [0, length]). NULL is a
 *  no-op. On a model with sliding-window layers, whose cache keeps only the last window - 1 +
 *  n_batch positions, a cut further back than that ring still reaches forgets the whole sequence:
 *  read moelite_context_kv_length afterwards (moelite_generate does, and re-evaluates the prompt). */
MOELITE_API void moelite_context_kv_truncate(moelite_context* ctx, int32_t n_keep);
/** Saves the context's state -- every sequence's tokens and KV cache rows -- to `path`, so that
 *  moelite_context_load can restore it later instead of evaluating the prompt again. The file is
 *  versioned, compressed with zstd when the system's libzstd.so.1 can be loaded (else stored
 *  uncompressed, still loadable), checksummed, and written atomically: into a temporary file beside
 *  `path`, flushed, then renamed over it, so `path` is either its old self or the whole new file.
 *  Windowed layers save only the positions their ring still holds. Errors: MOELITE_ERR_IO (the
 *  directory is not writable, the disk is full; `path` unchanged), MOELITE_ERR_OUT_OF_MEMORY,
 *  device errors reading the cache. Thread-safety: as moelite_eval (one thread per context). */
MOELITE_API moelite_status moelite_context_save(const moelite_context* ctx, const char* path);
/** Restores a state saved by moelite_context_save into `ctx`: each saved sequence gets its tokens
 *  and cache rows back (sequences the file does not hold are reset), so evaluation goes on exactly
 *  as it would have without the interruption (the logits are bitwise those of the uninterrupted
 *  run on the same backend). The whole file is checked before the context changes:
 *  MOELITE_ERR_FILE_NOT_FOUND; MOELITE_ERR_BAD_SESSION (not a session, truncated, corrupt, an
 *  unsupported version); MOELITE_ERR_SESSION_MISMATCH (saved with another model -- a fingerprint of
 *  its tensors and weights --, or more sequences or positions than this context holds);
 *  MOELITE_ERR_NOT_IMPLEMENTED (a compressed file and no libzstd); MOELITE_ERR_OUT_OF_MEMORY. In all
 *  of those the context is unchanged. A device error while writing the rows back leaves every
 *  sequence empty. The last evaluation's logits are dropped. The context may differ from the saving one in n_batch, n_seq
 *  (enough for the file's sequences), n_ctx (enough for its positions) and backend (its rows are
 *  then those another backend computed: equal within float rounding, not bitwise). */
MOELITE_API moelite_status moelite_context_load(moelite_context* ctx, const char* path);
/** Sequences the context holds (moelite_context_params_set_n_seq; 0 for NULL). */
MOELITE_API int32_t moelite_context_n_seq(const moelite_context* ctx);
/** Tokens held in sequence `seq`'s KV cache (0 for NULL or a sequence id out of range). */
MOELITE_API int32_t moelite_context_seq_length(const moelite_context* ctx, int32_t seq);
/** Keeps the first n_keep tokens of sequence `seq` (clamped to [0, length]) and forgets the rest;
 *  n_keep 0 resets it. The other sequences are untouched; the logits of the last evaluation are
 *  dropped, as with moelite_context_kv_truncate. MOELITE_ERR_INVALID_ARGUMENT for NULL ctx or a
 *  sequence id out of range. */
MOELITE_API moelite_status moelite_context_seq_truncate(moelite_context* ctx, int32_t seq, int32_t n_keep);
/** The token ids the KV cache holds, in order (moelite_context_kv_length of them), into `tokens`
 *  (room for `capacity`). *n_tokens receives the count; MOELITE_ERR_BUFFER_TOO_SMALL when it
 *  exceeds capacity (tokens untouched). After moelite_generate the cache holds the prompt and the
 *  generated tokens except the last one, which was sampled but not evaluated. */
MOELITE_API moelite_status moelite_context_get_tokens(const moelite_context* ctx, int32_t* tokens, int32_t capacity,
                                                      int32_t* n_tokens);
/** Expert-store counters of this context's evaluations alone (moelite_model_expert_stats counts
 *  every context of the model), by layer or for all layers (layer -1): the experts it asked for,
 *  hit and missed, the bytes of the loads it started and its waits, kept apart from contexts
 *  evaluating at the same time (the counters of all contexts add up to the model's).
 *  read_busy_seconds is the storage's busy time while it evaluated, shared with such contexts.
 *  Speculative loads that finish or are wasted after its evaluation returned count for it too. struct_size as for moelite_model_expert_stats.
 *  Thread-safety as for the context. MOELITE_ERR_INVALID_ARGUMENT for a bad layer, a NULL out or a
 *  struct_size below sizeof(size_t). */
MOELITE_API moelite_status moelite_context_expert_stats(const moelite_context* ctx, int32_t layer,
                                                        moelite_expert_stats* out);
/** Zeroes this context's counters (not the model's). NULL is a no-op. */
MOELITE_API void moelite_context_reset_expert_stats(moelite_context* ctx);

MOELITE_DEPRECATED("moelite_context_kv_length") MOELITE_API int32_t moelite_kv_length(const moelite_context* ctx);
MOELITE_DEPRECATED("moelite_context_kv_reset") MOELITE_API void moelite_kv_reset(moelite_context* ctx);
MOELITE_DEPRECATED("moelite_context_kv_truncate")
MOELITE_API void moelite_kv_truncate(moelite_context* ctx, int32_t n_keep);

/* ------------------------------------------------------------------------------------------ */
/* Tokens and text                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* All functions in this section only read the model and are thread-safe. They fail with
 * MOELITE_ERR_MISSING_METADATA when the model file carries no tokenizer. */

enum {
  MOELITE_TOKENIZE_ADD_SPECIAL = 1,  /* add BOS/EOS as the model's metadata asks */
  MOELITE_TOKENIZE_PARSE_SPECIAL = 2 /* text like "<|im_start|>" becomes that control token;
                                        without it, such text is tokenized as plain text */
};

/** Tokenizes `text_len` bytes of `text` (any bytes; need not be NUL-terminated or valid UTF-8)
 *  into `tokens` (room for `capacity` ids). *n_tokens receives the count; when it exceeds
 *  `capacity` the call returns MOELITE_ERR_BUFFER_TOO_SMALL and nothing useful is in `tokens`,
 *  so call again with a buffer of *n_tokens. `tokens` may be NULL when capacity is 0. */
MOELITE_API moelite_status moelite_tokenize(const moelite_model* model, const char* text, size_t text_len,
                                            uint32_t flags, int32_t* tokens, int32_t capacity, int32_t* n_tokens);

enum {
  MOELITE_DETOKENIZE_RENDER_SPECIAL = 1 /* include the text of control tokens (BOS, <|im_end|>) */
};

/** The bytes `n_tokens` tokens stand for, written to `text` (room for `capacity` bytes, not
 *  NUL-terminated). *text_len receives the length; MOELITE_ERR_BUFFER_TOO_SMALL when it exceeds
 *  capacity. A single token's bytes may be an incomplete UTF-8 sequence; moelite_generate's
 *  streaming callback never splits characters. MOELITE_ERR_BAD_TOKEN for an id out of range. */
MOELITE_API moelite_status moelite_detokenize(const moelite_model* model, const int32_t* tokens, int32_t n_tokens,
                                              uint32_t flags, char* text, size_t capacity, size_t* text_len);

/** Beginning/end-of-sequence token ids, -1 if the vocabulary has none. */
MOELITE_API int32_t moelite_token_bos(const moelite_model* model);
MOELITE_API int32_t moelite_token_eos(const moelite_model* model);
/** 1 if generation stops at `token` (EOS, end-of-turn and similar control tokens), else 0. */
MOELITE_API int32_t moelite_token_is_end(const moelite_model* model, int32_t token);

/** Token attributes (tokenizer.ggml.token_type), as bit flags. */
enum {
  MOELITE_TOKEN_ATTR_NORMAL = 1,
  MOELITE_TOKEN_ATTR_UNKNOWN = 2,      /* the unknown token */
  MOELITE_TOKEN_ATTR_CONTROL = 4,      /* a control token (BOS, <|im_start|>): renders as nothing
                                          unless MOELITE_DETOKENIZE_RENDER_SPECIAL */
  MOELITE_TOKEN_ATTR_USER_DEFINED = 8, /* an added token matched in text like a word */
  MOELITE_TOKEN_ATTR_UNUSED = 16,
  MOELITE_TOKEN_ATTR_BYTE = 32,        /* a byte token such as <0x0A> */
  MOELITE_TOKEN_ATTR_END = 64          /* generation stops at it (moelite_token_is_end) */
};
/** The MOELITE_TOKEN_ATTR_* flags of `token`; 0 for an id out of range, a NULL model or one
 *  without a tokenizer. Thread-safe. */
MOELITE_API uint32_t moelite_token_attrs(const moelite_model* model, int32_t token);
/** The vocabulary string of `token` as stored in the file (e.g. "<|im_end|>", "\u0120the" for
 *  byte-level BPE); NUL-terminated, owned by the model. NULL for an id out of range. Use
 *  moelite_detokenize for the bytes a token stands for. NULL too for a NULL model or one without a
 *  tokenizer. Thread-safe. */
MOELITE_API const char* moelite_token_text(const moelite_model* model, int32_t token);

/** One chat message: role ("system", "user", "assistant") and content, both NUL-terminated. */
typedef struct moelite_chat_message {
  const char* role;
  const char* content;
} moelite_chat_message;

/** Formats messages with the model's chat template (tokenizer.chat_template, or the one set with
 *  moelite_model_params_set_chat_template), recognised as one of the common families
 *  (ChatML/Qwen, Mistral [INST], Llama-3, OLMoE/Tulu, gpt-oss harmony, DeepSeek-V2, DeepSeek-V3).
 *  An unknown or absent template falls back to
 *  plain "role: content" lines with a logged warning. `add_assistant_prompt` appends the opening
 *  of the assistant's reply. Output like moelite_detokenize (length in *text_len,
 *  MOELITE_ERR_BUFFER_TOO_SMALL when too small). The text is for display and logs: to evaluate a
 *  conversation use moelite_chat_tokenize, which keeps message content from becoming markers. */
MOELITE_API moelite_status moelite_chat_format(const moelite_model* model, const moelite_chat_message* messages,
                                               size_t n_messages, int32_t add_assistant_prompt, char* text,
                                               size_t capacity, size_t* text_len);
/** The template family moelite recognised: "chatml", "mistral", "llama3", "tulu", "harmony" (gpt-oss),
 *  "deepseek2", "deepseek3" or "plain". */
MOELITE_API const char* moelite_chat_template_kind(const moelite_model* model);

/** Formats messages like moelite_chat_format and tokenizes the result so that message content is
 *  always text: control and other special tokens are recognised only where the template wrote
 *  them, so content (or a role) that spells "<|im_end|>" or "[INST]" becomes the tokens of those
 *  characters, never a turn marker. BOS/EOS are added as the vocabulary asks. This is what chat
 *  front-ends must evaluate: the text of moelite_chat_format tokenized with
 *  MOELITE_TOKENIZE_PARSE_SPECIAL would turn such content into real markers (prompt injection).
 *  Output like moelite_tokenize (count in *n_tokens, MOELITE_ERR_BUFFER_TOO_SMALL when it exceeds
 *  capacity). Thread-safe. */
MOELITE_API moelite_status moelite_chat_tokenize(const moelite_model* model, const moelite_chat_message* messages,
                                                 size_t n_messages, int32_t add_assistant_prompt, int32_t* tokens,
                                                 int32_t capacity, int32_t* n_tokens);

/* ------------------------------------------------------------------------------------------ */
/* Generation                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct moelite_generate_params moelite_generate_params;

/** Receives generated text as it is produced: `len` (>= 1) bytes at `piece`, never splitting a
 *  UTF-8 character and never containing (the start of) a stop string. Return non-zero to
 *  continue, 0 to stop generation (stop reason MOELITE_STOP_ABORTED). Runs on the generating
 *  thread; the bytes are valid during the call. */
typedef int (*moelite_piece_fn)(const char* piece, size_t len, void* user_data);

/** Receives each generated token as it is produced, in order, before the next one is computed:
 *  its id and the text it released to the stream (what the piece callback receives at that
 *  token; len may be 0 while an unfinished UTF-8 character or a possible stop string is held
 *  back). Text still held back at the end comes in one last call with token -1. The
 *  end-of-generation token is not reported (stop reason MOELITE_STOP_END_TOKEN). Return non-zero
 *  to continue, 0 to stop (MOELITE_STOP_ABORTED). Runs on the generating thread. */
typedef int (*moelite_token_fn)(int32_t token, const char* text, size_t len, void* user_data);

/** Sees the logits of each step before a token is drawn and may change them in place: `logits`
 *  (n_vocab floats, the logit bias already added) is a copy the callback owns during the call;
 *  a token set to -INFINITY is never drawn (masking, e.g. for constrained decoding). `history`
 *  holds the n_history tokens of the sequence so far (prompt, then generated). Runs before the
 *  repetition penalty, temperature and filters. Return non-zero to continue, 0 to stop
 *  (MOELITE_STOP_ABORTED; with a moelite_sampler, MOELITE_ERR_ABORTED). Runs on the calling
 *  thread. */
typedef int (*moelite_logits_fn)(float* logits, int32_t n_vocab, const int32_t* history, int32_t n_history,
                                 void* user_data);

/** Defaults: max_tokens 256, temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat penalty
 *  1.0 (off) over the last 64 tokens, seed 0x5eed, no stop strings, no logit bias, no callbacks,
 *  parse_special on. Temperature 0 means greedy decoding. The same seed and inputs give the same
 *  text. Returns NULL only when out of memory.
 *  Every setter fails with MOELITE_ERR_INVALID_ARGUMENT for a NULL object or a value outside its
 *  stated range, and then leaves the object unchanged. */
MOELITE_API moelite_generate_params* moelite_generate_params_create(void);
MOELITE_API void moelite_generate_params_free(moelite_generate_params* params);
/** Most tokens generated, >= 0 (0: evaluate the prompt only). */
MOELITE_API moelite_status moelite_generate_params_set_max_tokens(moelite_generate_params* p, int32_t n);
/** Softmax temperature, finite and >= 0; 0 is greedy (the highest logit, lowest id on ties). */
MOELITE_API moelite_status moelite_generate_params_set_temperature(moelite_generate_params* p, float t);
/** Keep the k most likely tokens, >= 0; 0 turns the filter off. */
MOELITE_API moelite_status moelite_generate_params_set_top_k(moelite_generate_params* p, int32_t k);
/** Keep the smallest set of most likely tokens whose probability reaches top_p, in (0, 1]; 1 off. */
MOELITE_API moelite_status moelite_generate_params_set_top_p(moelite_generate_params* p, float top_p);
/** Drop tokens less likely than min_p times the most likely one, in [0, 1]; 0 off. */
MOELITE_API moelite_status moelite_generate_params_set_min_p(moelite_generate_params* p, float min_p);
/** Repetition penalty (finite, > 0; 1 off) on the tokens among the last `last_n` of the sequence
 *  (prompt included): a logit l > 0 becomes l / penalty, else l x penalty. last_n >= -1: -1 the
 *  whole sequence, 0 none. */
MOELITE_API moelite_status moelite_generate_params_set_repeat_penalty(moelite_generate_params* p, float penalty,
                                                                      int32_t last_n);
/** Seed of the sampler's generator (any value). */
MOELITE_API moelite_status moelite_generate_params_set_seed(moelite_generate_params* p, uint64_t seed);
/** Adds a stop string (non-empty, copied). Generation ends before it; the stop string is not
 *  emitted. */
MOELITE_API moelite_status moelite_generate_params_add_stop(moelite_generate_params* p, const char* stop);
/** Adds `bias` to token `token`'s logit at every step (-INFINITY bans it; other values finite).
 *  Setting a token again replaces its bias; bias 0 removes it. `token` >= 0; a token outside the
 *  model's vocabulary is ignored at generation. */
MOELITE_API moelite_status moelite_generate_params_set_logit_bias(moelite_generate_params* p, int32_t token,
                                                                  float bias);
/** Removes every logit bias. */
MOELITE_API moelite_status moelite_generate_params_clear_logit_bias(moelite_generate_params* p);
/** Text prompts of moelite_generate: non-zero (default) tokenizes control-token text such as
 *  "<|im_start|>" as those tokens (a prompt formatted by the application); 0 tokenizes it as text.
 *  Prompts holding untrusted text must not be built by string concatenation with it on: use
 *  moelite_chat_tokenize + moelite_generate_tokens. */
MOELITE_API moelite_status moelite_generate_params_set_parse_special(moelite_generate_params* p, int32_t parse_special);
/** The text callback (NULL removes it) and its user pointer. */
MOELITE_API moelite_status moelite_generate_params_set_callback(moelite_generate_params* p, moelite_piece_fn fn,
                                                                void* user_data);
/** The token callback (NULL removes it) and its user pointer; it may be set beside the text one. */
MOELITE_API moelite_status moelite_generate_params_set_token_callback(moelite_generate_params* p, moelite_token_fn fn,
                                                                      void* user_data);
/** The logits callback (NULL removes it) and its user pointer; also used by a moelite_sampler made
 *  from these parameters. */
MOELITE_API moelite_status moelite_generate_params_set_logits_callback(moelite_generate_params* p,
                                                                       moelite_logits_fn fn, void* user_data);

typedef enum moelite_stop_reason {
  MOELITE_STOP_END_TOKEN = 0,    /* the model produced an end-of-generation token */
  MOELITE_STOP_MAX_TOKENS = 1,
  MOELITE_STOP_STRING = 2,
  MOELITE_STOP_ABORTED = 3,      /* a piece, token or logits callback returned 0 */
  MOELITE_STOP_CONTEXT_FULL = 4, /* the context is full; the call returned MOELITE_ERR_CONTEXT_FULL */
  MOELITE_STOP_ERROR = 5,        /* the call failed (see its status) */
  /* Deprecated spelling of MOELITE_STOP_ABORTED (same value). */
  MOELITE_STOP_CALLBACK MOELITE_DEPRECATED("MOELITE_STOP_ABORTED") = 3
} moelite_stop_reason;

/** Timing and counts of one generation call. Set struct_size = sizeof(moelite_generate_stats)
 *  before the call; moelite writes only the fields that lie wholly within struct_size, so older
 *  callers keep working. MOELITE_ERR_INVALID_ARGUMENT when struct_size is below sizeof(size_t). */
typedef struct moelite_generate_stats {
  size_t struct_size;
  int32_t n_prompt_tokens; /* prompt tokens evaluated by this call (after cache reuse) */
  int32_t n_cached_tokens; /* prompt tokens reused from the context's KV cache */
  int32_t n_generated_tokens;
  int32_t stop_reason; /* a moelite_stop_reason */
  double prompt_seconds;
  double generate_seconds;
  double time_to_first_token_seconds;
  double prompt_tokens_per_second;
  double generated_tokens_per_second;
} moelite_generate_stats;

/** Generates a continuation of `prompt` (prompt_len bytes; tokenized with ADD_SPECIAL, and with
 *  PARSE_SPECIAL unless moelite_generate_params_set_parse_special(p, 0)). The prompt is the whole
 *  sequence: the context's KV cache is reused for the longest prefix it shares with the prompt's
 *  tokens and recomputed after it, so multi-turn chat that resends the conversation only pays for
 *  the new turn. The generated tokens stay in the cache (the last one only once evaluated: see
 *  moelite_context_get_tokens). `params` may be NULL for defaults; `stats` may be NULL.
 *
 *  Returns MOELITE_OK when generation ended by an end token, max_tokens, a stop string or a
 *  callback (stats->stop_reason says which). Errors: MOELITE_ERR_CONTEXT_FULL when the prompt
 *  does not fit (nothing evaluated) or generation reached the end of the context (the text so
 *  far was delivered; stop reason MOELITE_STOP_CONTEXT_FULL); MOELITE_ERR_ABORTED from the
 *  context's abort callback; MOELITE_ERR_INVALID_ARGUMENT when bias or the logits callback left
 *  no token to draw; evaluation errors (I/O, backend). On any error `stats` is still filled
 *  with what was done (stop reason MOELITE_STOP_ERROR unless a more specific one applies), and
 *  the context keeps the tokens evaluated before the error: the reused prefix, the prompt if its
 *  evaluation succeeded, and the generated tokens evaluated so far (moelite_context_kv_length
 *  tells how many); it stays usable. The abort callback of the context is honoured. */
MOELITE_API moelite_status moelite_generate(moelite_context* ctx, const char* prompt, size_t prompt_len,
                                            const moelite_generate_params* params, moelite_generate_stats* stats);

/** moelite_generate from token ids (`n_tokens` >= 1, each in [0, n_vocab)): the prompt is taken
 *  as given, nothing is added. With moelite_chat_tokenize this is the safe way to run a chat.
 *  MOELITE_ERR_BAD_TOKEN for an id out of range (nothing evaluated); otherwise as
 *  moelite_generate. */
MOELITE_API moelite_status moelite_generate_tokens(moelite_context* ctx, const int32_t* tokens, int32_t n_tokens,
                                                   const moelite_generate_params* params,
                                                   moelite_generate_stats* stats);

/* ------------------------------------------------------------------------------------------ */
/* Samplers: the token choice of generation, for applications that drive moelite_eval          */
/* ------------------------------------------------------------------------------------------ */

typedef struct moelite_sampler moelite_sampler;

/** Creates a sampler from the sampling settings of `params` (temperature, top_k, top_p, min_p,
 *  repetition penalty, seed, logit bias, logits callback; copied, so params may be freed). The
 *  sampler keeps a history of accepted tokens for the repetition penalty and the logits
 *  callback. A loop of moelite_sampler_sample and moelite_eval, after accepting the prompt's
 *  tokens, draws exactly the tokens moelite_generate draws with the same params (same seed).
 *  `params` NULL: the defaults. A sampler is used by one thread at a time. */
MOELITE_API moelite_status moelite_sampler_create(const moelite_generate_params* params, moelite_sampler** out);
MOELITE_API void moelite_sampler_free(moelite_sampler* sampler);
/** Appends tokens to the sampler's history (e.g. the prompt). Ids are not checked here. */
MOELITE_API moelite_status moelite_sampler_accept(moelite_sampler* sampler, const int32_t* tokens, int32_t n_tokens);
/** Draws a token from the logits of row `i` of ctx's last evaluation (as moelite_get_logits; -1
 *  the last) and accepts it into the history. MOELITE_ERR_INVALID_ARGUMENT when the row has no
 *  logits or no token is left to draw (all banned or masked); MOELITE_ERR_ABORTED when the logits
 *  callback returned 0. *out_token is written on success only. */
MOELITE_API moelite_status moelite_sampler_sample(moelite_sampler* sampler, const moelite_context* ctx, int32_t i,
                                                  int32_t* out_token);
/** The same from any `n_vocab` (>= 1) logits, e.g. modified by the application. */
MOELITE_API moelite_status moelite_sampler_sample_logits(moelite_sampler* sampler, const float* logits,
                                                         int32_t n_vocab, int32_t* out_token);
/** Forgets the history and restarts the generator from the seed. NULL is a no-op. */
MOELITE_API void moelite_sampler_reset(moelite_sampler* sampler);

/* ------------------------------------------------------------------------------------------ */
/* Request queues: many generation requests served together by one context's sequences        */
/* ------------------------------------------------------------------------------------------ */

/** A queue of generation requests served by the sequences of one context (continuous batching):
 *  up to moelite_context_n_seq requests run at once, each in a sequence of its own, and each
 *  moelite_queue_step evaluates the next token of every running request together with prompt
 *  chunks of newly admitted ones (up to the context's n_batch tokens) in one moelite_eval_batch,
 *  so they share each layer's weight reads and, under a memory budget, each expert's load. A
 *  finished request frees its sequence for the next waiting one, admitted in order of addition.
 *
 *  Results do not depend on the batching: a request's tokens, text and stop reason are exactly
 *  those moelite_generate_tokens gives for the same prompt and parameters on a context of its
 *  own, whatever runs beside it and whatever n_seq (its logits are bitwise those of evaluating it
 *  alone; it has its own sampler, seeded from its parameters). A sequence keeps the tokens of the
 *  request it served: a new request is admitted into the free sequence whose cached tokens share
 *  the longest prefix with its prompt (a common system prompt, the next turn of a conversation)
 *  and evaluates only the rest.
 *
 *  Ownership: the queue borrows the context, which must outlive it; while the queue lives the
 *  application must not evaluate the context or change its sequences itself (a running request
 *  whose sequence changed ends with MOELITE_STOP_ERROR). Thread-safety: a queue and its context
 *  are used by one thread at a time; the generation parameters' callbacks run on the thread that
 *  calls moelite_queue_step and must not call the queue's functions (those return
 *  MOELITE_ERR_INVALID_ARGUMENT from inside a step). The context's abort callback is honoured. */
typedef struct moelite_queue moelite_queue;

/** Request states (moelite_queue_request_state, moelite_queue_event): waiting for a sequence,
 *  running, or finished with a moelite_stop_reason (>= 0): MOELITE_STOP_END_TOKEN,
 *  MOELITE_STOP_MAX_TOKENS, MOELITE_STOP_STRING, MOELITE_STOP_ABORTED (cancelled, or a callback
 *  returned 0), MOELITE_STOP_CONTEXT_FULL (the sequence is full; what was generated stands),
 *  MOELITE_STOP_ERROR (the parameters left no token to draw, its sequence was changed outside the
 *  queue, or memory ran out while its token was sampled: its sequence had already taken the step,
 *  so it cannot go on exactly; the step itself succeeds for the others). */
#define MOELITE_REQUEST_WAITING -2
#define MOELITE_REQUEST_RUNNING -1

/** Creates an empty queue over `ctx` (see above). Errors: MOELITE_ERR_INVALID_ARGUMENT (NULL),
 *  MOELITE_ERR_MISSING_METADATA (the model has no tokenizer), MOELITE_ERR_OUT_OF_MEMORY. */
MOELITE_API moelite_status moelite_queue_create(moelite_context* ctx, moelite_queue** out);
/** Frees the queue and every request it holds (running ones stop where they are; their sequences
 *  keep what was evaluated). The context is not freed. NULL is a no-op. */
MOELITE_API void moelite_queue_free(moelite_queue* queue);

/** Adds a request: `n_prompt` >= 1 token ids, taken as given (moelite_tokenize or
 *  moelite_chat_tokenize make them), copied; `params` (NULL: the defaults) copied too: max_tokens,
 *  sampling, seed, stop strings, logit bias, and the text, token and logits callbacks, which then
 *  run for this request's tokens only. *out_id receives the request's id (0, 1, 2 ... in order of
 *  addition, never reused). Errors, nothing added: MOELITE_ERR_INVALID_ARGUMENT (NULL, n_prompt
 *  < 1), MOELITE_ERR_BAD_TOKEN (an id outside the vocabulary), MOELITE_ERR_CONTEXT_FULL (more
 *  tokens than a sequence holds, moelite_context_n_ctx), MOELITE_ERR_OUT_OF_MEMORY. */
MOELITE_API moelite_status moelite_queue_add(moelite_queue* queue, const int32_t* prompt, int32_t n_prompt,
                                             const moelite_generate_params* params, int64_t* out_id);

/** One step: admits waiting requests into free sequences, evaluates (one moelite_eval_batch) and
 *  samples every request that got logits, running its callbacks. *out_n_events (may be NULL)
 *  receives the number of events of the step: one per request that sampled or finished in it,
 *  read with moelite_queue_event. A step with nothing to run returns MOELITE_OK with 0 events.
 *  Errors: those of moelite_eval_batch (MOELITE_ERR_IO, MOELITE_ERR_ABORTED, device errors ...):
 *  then nothing was evaluated or sampled (the sequences are as before the step) and the next
 *  step tries again; MOELITE_ERR_OUT_OF_MEMORY, likewise with nothing evaluated (requests may have
 *  been admitted). */
MOELITE_API moelite_status moelite_queue_step(moelite_queue* queue, int32_t* out_n_events);

/** Event `i` (0 <= i < the last step's count) of the last step: the request, the token it
 *  generated in the step (-1 when none: it ended on an end token, a stop or an error, or only
 *  finished its prompt with max_tokens 0), and its state after the step (MOELITE_REQUEST_RUNNING
 *  or a moelite_stop_reason). Any out pointer may be NULL. MOELITE_ERR_INVALID_ARGUMENT for a
 *  NULL queue or an index out of range. */
MOELITE_API moelite_status moelite_queue_event(const moelite_queue* queue, int32_t i, int64_t* request_id,
                                               int32_t* token, int32_t* state);

/** Requests waiting for a sequence, running, and finished but not removed (0 for NULL). The
 *  queue has work while waiting + running > 0. */
MOELITE_API int64_t moelite_queue_waiting(const moelite_queue* queue);
MOELITE_API int64_t moelite_queue_running(const moelite_queue* queue);
MOELITE_API int64_t moelite_queue_finished(const moelite_queue* queue);

/** The request's state (MOELITE_REQUEST_WAITING, _RUNNING or its moelite_stop_reason) into
 *  *state. MOELITE_ERR_INVALID_ARGUMENT for an unknown or removed id. */
MOELITE_API moelite_status moelite_queue_request_state(const moelite_queue* queue, int64_t id, int32_t* state);
/** The request's counts and times so far, in a moelite_generate_stats (struct_size as there):
 *  n_cached_tokens, the prompt tokens its sequence already held when it was admitted;
 *  n_prompt_tokens, the rest (evaluated); n_generated_tokens; stop_reason, its state (as
 *  moelite_queue_request_state: negative while waiting or running); prompt_seconds, from its
 *  admission to its first token; time_to_first_token_seconds, from moelite_queue_add (the wait
 *  for a sequence included); generate_seconds, from its first token to its end (or now);
 *  generated_tokens_per_second over the tokens after the first. Steps are shared, so a request's
 *  times include the work of the requests batched with it. MOELITE_ERR_INVALID_ARGUMENT for an
 *  unknown id, a NULL stats or a struct_size below sizeof(size_t). */
MOELITE_API moelite_status moelite_queue_request_stats(const moelite_queue* queue, int64_t id,
                                                       moelite_generate_stats* stats);
/** The tokens the request generated so far (an end token is not one of them) into `tokens`
 *  (room for `capacity`); *n_tokens receives the count. MOELITE_ERR_BUFFER_TOO_SMALL when it
 *  exceeds capacity (tokens untouched); MOELITE_ERR_INVALID_ARGUMENT for an unknown id. */
MOELITE_API moelite_status moelite_queue_request_tokens(const moelite_queue* queue, int64_t id, int32_t* tokens,
                                                        int32_t capacity, int32_t* n_tokens);
/** The text the request emitted so far (what its text callback received: stop strings cut,
 *  UTF-8 characters whole) into `buf` (room for `capacity` bytes, not NUL-terminated); *length
 *  receives its length. MOELITE_ERR_BUFFER_TOO_SMALL when it exceeds capacity;
 *  MOELITE_ERR_INVALID_ARGUMENT for an unknown id or a NULL length. */
MOELITE_API moelite_status moelite_queue_request_text(const moelite_queue* queue, int64_t id, char* buf,
                                                      size_t capacity, size_t* length);
/** Cancels a waiting or running request: it finishes at once with MOELITE_STOP_ABORTED and frees
 *  its sequence; what it generated stays readable. A finished request is left as it is.
 *  MOELITE_ERR_INVALID_ARGUMENT for an unknown id. */
MOELITE_API moelite_status moelite_queue_cancel(moelite_queue* queue, int64_t id);
/** Cancels the request if it has not finished and forgets it (its id is then unknown): the queue
 *  keeps a finished request's results until it is removed. MOELITE_ERR_INVALID_ARGUMENT for an
 *  unknown id. */
MOELITE_API moelite_status moelite_queue_remove(moelite_queue* queue, int64_t id);

#ifdef __cplusplus
}
#endif

#endif /* MOELITE_H */
