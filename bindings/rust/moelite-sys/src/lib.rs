//! Raw declarations of the moelite C API, written by hand after `include/moelite.h` (no bindgen:
//! nothing to download, nothing to run at build time). `tests/header.rs` parses the header and
//! fails when a function, constant, callback or struct here differs from it, so the two cannot
//! drift apart. Every function's contract (ownership, thread safety, errors) is documented in the
//! header; the safe `moelite` crate builds on these.
#![allow(non_camel_case_types)]

pub use std::os::raw::{c_char, c_int, c_uint, c_void};

pub const MOELITE_VERSION_NUMBER: u32 = MOELITE_VERSION_MAJOR * 10000 + MOELITE_VERSION_MINOR * 100 + MOELITE_VERSION_PATCH;
pub const MOELITE_MAX_BUDGET_HEADROOM: u64 = 1 << 62;
pub const MOELITE_VERSION_MAJOR: u32 = 0;
pub const MOELITE_VERSION_MINOR: u32 = 1;
pub const MOELITE_VERSION_PATCH: u32 = 0;
pub const MOELITE_MAX_THREADS: u32 = 512;
pub const MOELITE_MAX_LAYERS: u32 = 1024;
pub const MOELITE_MAX_EXPERTS: u32 = 4096;
pub const MOELITE_MAX_WIDTH: u32 = 262144;
pub const MOELITE_MAX_HEADS: u32 = 1024;
pub const MOELITE_MAX_HEAD_DIM: u32 = 4096;
pub const MOELITE_MAX_CONTEXT: u32 = 16777216;
pub const MOELITE_MAX_VOCAB: u32 = 16777216;
pub const MOELITE_MAX_SEQUENCES: u32 = 256;
pub const MOELITE_REQUEST_WAITING: i32 = -2;
pub const MOELITE_REQUEST_RUNNING: i32 = -1;
pub type moelite_status = c_int;
pub const MOELITE_OK: moelite_status = 0;
pub const MOELITE_ERR_INVALID_ARGUMENT: moelite_status = 1;
pub const MOELITE_ERR_OUT_OF_MEMORY: moelite_status = 2;
pub const MOELITE_ERR_FILE_NOT_FOUND: moelite_status = 3;
pub const MOELITE_ERR_IO: moelite_status = 4;
pub const MOELITE_ERR_BUFFER_TOO_SMALL: moelite_status = 5;
pub const MOELITE_ERR_SYSTEM_LIMIT: moelite_status = 6;
pub const MOELITE_ERR_GGUF_BAD_MAGIC: moelite_status = 10;
pub const MOELITE_ERR_GGUF_BAD_VERSION: moelite_status = 11;
pub const MOELITE_ERR_GGUF_TRUNCATED: moelite_status = 12;
pub const MOELITE_ERR_GGUF_CORRUPT: moelite_status = 13;
pub const MOELITE_ERR_GGUF_UNKNOWN_TYPE: moelite_status = 14;
pub const MOELITE_ERR_GGUF_OUT_OF_BOUNDS: moelite_status = 15;
pub const MOELITE_ERR_GGUF_OVERLAP: moelite_status = 16;
pub const MOELITE_ERR_UNSUPPORTED_ARCH: moelite_status = 20;
pub const MOELITE_ERR_UNSUPPORTED_TYPE: moelite_status = 21;
pub const MOELITE_ERR_MISSING_TENSOR: moelite_status = 22;
pub const MOELITE_ERR_BAD_SHAPE: moelite_status = 23;
pub const MOELITE_ERR_MISSING_METADATA: moelite_status = 24;
pub const MOELITE_ERR_BAD_METADATA: moelite_status = 25;
pub const MOELITE_ERR_BACKEND_UNAVAILABLE: moelite_status = 30;
pub const MOELITE_ERR_BUDGET_TOO_SMALL: moelite_status = 31;
pub const MOELITE_ERR_NOT_IMPLEMENTED: moelite_status = 32;
pub const MOELITE_ERR_BAD_PROFILE: moelite_status = 33;
pub const MOELITE_ERR_BACKEND: moelite_status = 34;
pub const MOELITE_ERR_CONTEXT_FULL: moelite_status = 40;
pub const MOELITE_ERR_BAD_TOKEN: moelite_status = 41;
pub const MOELITE_ERR_ABORTED: moelite_status = 42;
pub const MOELITE_ERR_PROGRESS_ABORTED: moelite_status = 43;
pub const MOELITE_ERR_BUSY: moelite_status = 44;
pub const MOELITE_ERR_BAD_SESSION: moelite_status = 50;
pub const MOELITE_ERR_SESSION_MISMATCH: moelite_status = 51;
pub const MOELITE_ERR_INTERNAL: moelite_status = 99;
pub const MOELITE_ERR_CANCELLED: moelite_status = 43;
pub type moelite_log_level = c_int;
pub const MOELITE_LOG_DEBUG: moelite_log_level = 0;
pub const MOELITE_LOG_INFO: moelite_log_level = 1;
pub const MOELITE_LOG_WARN: moelite_log_level = 2;
pub const MOELITE_LOG_ERROR: moelite_log_level = 3;
pub const MOELITE_LOG_NONE: moelite_log_level = 4;
pub type moelite_backend = c_int;
pub const MOELITE_BACKEND_AUTO: moelite_backend = 0;
pub const MOELITE_BACKEND_CPU: moelite_backend = 1;
pub const MOELITE_BACKEND_VULKAN: moelite_backend = 2;
pub const MOELITE_BACKEND_CUDA: moelite_backend = 3;
pub type moelite_model_key = c_int;
pub const MOELITE_MODEL_N_LAYERS: moelite_model_key = 0;
pub const MOELITE_MODEL_N_EXPERTS: moelite_model_key = 1;
pub const MOELITE_MODEL_N_EXPERTS_USED: moelite_model_key = 2;
pub const MOELITE_MODEL_N_SHARED_EXPERTS: moelite_model_key = 3;
pub const MOELITE_MODEL_N_VOCAB: moelite_model_key = 4;
pub const MOELITE_MODEL_N_EMBD: moelite_model_key = 5;
pub const MOELITE_MODEL_N_HEAD: moelite_model_key = 6;
pub const MOELITE_MODEL_N_HEAD_KV: moelite_model_key = 7;
pub const MOELITE_MODEL_HEAD_DIM: moelite_model_key = 8;
pub const MOELITE_MODEL_N_FF_EXPERT: moelite_model_key = 9;
pub const MOELITE_MODEL_N_FF_SHARED: moelite_model_key = 10;
pub const MOELITE_MODEL_N_CTX_TRAIN: moelite_model_key = 11;
pub const MOELITE_MODEL_EXPERT_BYTES: moelite_model_key = 12;
pub const MOELITE_MODEL_DENSE_BYTES: moelite_model_key = 13;
pub const MOELITE_MODEL_N_PARAMS: moelite_model_key = 14;
pub const MOELITE_MODEL_N_ACTIVE_PARAMS: moelite_model_key = 15;
pub const MOELITE_MODEL_THREADS: moelite_model_key = 16;
pub const MOELITE_MODEL_BACKEND: moelite_model_key = 17;
pub const MOELITE_MODEL_ACTIVE_BYTES: moelite_model_key = 18;
pub const MOELITE_MODEL_EXPERT_BUDGET: moelite_model_key = 19;
pub const MOELITE_MODEL_EXPERT_POOL_BYTES: moelite_model_key = 20;
pub const MOELITE_MODEL_EXPERT_PEAK_BYTES: moelite_model_key = 21;
pub const MOELITE_MODEL_EXPERT_SLOTS: moelite_model_key = 22;
pub const MOELITE_MODEL_BUDGET_AUTO: moelite_model_key = 23;
pub const MOELITE_MODEL_BUDGET_AUTO_ROOM: moelite_model_key = 24;
pub const MOELITE_MODEL_BUDGET_AUTO_CONTEXT_BYTES: moelite_model_key = 25;
pub const MOELITE_MODEL_BUDGET_AUTO_HEADROOM: moelite_model_key = 26;
pub const MOELITE_MODEL_EXPERTS_ALL_FIT: moelite_model_key = 27;
pub const MOELITE_MODEL_EXPERT_MIN_BUDGET: moelite_model_key = 28;
pub const MOELITE_MODEL_SLIDING_WINDOW: moelite_model_key = 29;
pub const MOELITE_MODEL_N_WINDOWED_LAYERS: moelite_model_key = 30;
pub const MOELITE_MODEL_N_DENSE_LAYERS: moelite_model_key = 31;
pub const MOELITE_MODEL_KV_BYTES_PER_TOKEN: moelite_model_key = 32;
pub type moelite_platform_field = c_int;
pub const MOELITE_PLATFORM_MEM_TOTAL_BYTES: moelite_platform_field = 0;
pub const MOELITE_PLATFORM_MEM_AVAILABLE_BYTES: moelite_platform_field = 1;
pub const MOELITE_PLATFORM_CGROUP_LIMIT_BYTES: moelite_platform_field = 2;
pub const MOELITE_PLATFORM_CGROUP_USAGE_BYTES: moelite_platform_field = 3;
pub const MOELITE_PLATFORM_IS_JETSON: moelite_platform_field = 4;
pub const MOELITE_PLATFORM_UNIFIED_MEMORY: moelite_platform_field = 5;
pub const MOELITE_PLATFORM_CPUS_ONLINE: moelite_platform_field = 6;
pub const MOELITE_PLATFORM_CPUS_ALLOWED: moelite_platform_field = 7;
pub const MOELITE_PLATFORM_BIG_CORES: moelite_platform_field = 8;
pub const MOELITE_PLATFORM_DEFAULT_THREADS: moelite_platform_field = 9;
pub const MOELITE_PLATFORM_AUTO_BACKEND: moelite_platform_field = 10;
pub const MOELITE_PLATFORM_HAS_CUDA: moelite_platform_field = 11;
pub const MOELITE_PLATFORM_HAS_VULKAN: moelite_platform_field = 12;
pub const MOELITE_PLAN_BUDGET_AUTO: u64 = 0;
pub const MOELITE_PLAN_RESIDENT: u64 = u64::MAX;
pub type moelite_batch_plan_key = c_int;
pub const MOELITE_PLAN_N_SEQ: moelite_batch_plan_key = 0;
pub const MOELITE_PLAN_EXPERT_BUDGET: moelite_batch_plan_key = 1;
pub const MOELITE_PLAN_KV_BYTES: moelite_batch_plan_key = 2;
pub const MOELITE_PLAN_LOOKAHEAD: moelite_batch_plan_key = 3;
pub const MOELITE_PLAN_MEMORY: moelite_batch_plan_key = 4;
pub const MOELITE_PLAN_HEADROOM: moelite_batch_plan_key = 5;
pub type moelite_stop_reason = c_int;
pub const MOELITE_STOP_END_TOKEN: moelite_stop_reason = 0;
pub const MOELITE_STOP_MAX_TOKENS: moelite_stop_reason = 1;
pub const MOELITE_STOP_STRING: moelite_stop_reason = 2;
pub const MOELITE_STOP_ABORTED: moelite_stop_reason = 3;
pub const MOELITE_STOP_CONTEXT_FULL: moelite_stop_reason = 4;
pub const MOELITE_STOP_ERROR: moelite_stop_reason = 5;
pub const MOELITE_STOP_CALLBACK: moelite_stop_reason = 3;
pub const MOELITE_TOKENIZE_ADD_SPECIAL: c_int = 1;
pub const MOELITE_TOKENIZE_PARSE_SPECIAL: c_int = 2;
pub const MOELITE_DETOKENIZE_RENDER_SPECIAL: c_int = 1;
pub const MOELITE_TOKEN_ATTR_NORMAL: c_int = 1;
pub const MOELITE_TOKEN_ATTR_UNKNOWN: c_int = 2;
pub const MOELITE_TOKEN_ATTR_CONTROL: c_int = 4;
pub const MOELITE_TOKEN_ATTR_USER_DEFINED: c_int = 8;
pub const MOELITE_TOKEN_ATTR_UNUSED: c_int = 16;
pub const MOELITE_TOKEN_ATTR_BYTE: c_int = 32;
pub const MOELITE_TOKEN_ATTR_END: c_int = 64;
#[repr(C)]
pub struct moelite_model {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_model_params {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_calibrate_params {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_plan_params {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_batch_plan {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_context {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_context_params {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_generate_params {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_sampler {
    _private: [u8; 0],
}
#[repr(C)]
pub struct moelite_queue {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moelite_expert_stats {
    pub struct_size: usize,
    pub activations: u64,
    pub hits: u64,
    pub misses: u64,
    pub prefetches_issued: u64,
    pub prefetches_used: u64,
    pub prefetches_wasted: u64,
    pub bytes_read: u64,
    pub wait_seconds: f64,
    pub predicted: u64,
    pub predictions: u64,
    pub ready_when_needed: u64,
    pub routed_tokens: u64,
    pub routed_experts: u64,
    pub read_busy_seconds: f64,
    pub reads: u64,
}
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moelite_expert_compression {
    pub weight_type: *const c_char,
    pub matrices: i64,
    pub raw_bytes: u64,
    pub zstd_bytes: u64,
    pub decompress_gb_per_s: f64,
}
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moelite_quality_stats {
    pub struct_size: usize,
    pub gated_tokens: u64,
    pub predicted_loss: f64,
    pub metered_tokens: u64,
    pub kl_mean: f64,
    pub kl_stderr: f64,
    pub top1_agreement: f64,
    pub top1_stderr: f64,
    pub predicted_loss_metered: f64,
    pub meter_evaluations: u64,
    pub meter_seconds: f64,
    pub threshold: f64,
    pub target_kl: f64,
    pub kl_per_predicted: f64,
}
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moelite_expert_read_probe {
    pub struct_size: usize,
    pub read_gb_per_s: f64,
    pub reads_per_s: f64,
    pub read_bytes: f64,
    pub reads_in_flight: i32,
    pub copy_gb_per_s: f64,
}
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moelite_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
}
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moelite_generate_stats {
    pub struct_size: usize,
    pub n_prompt_tokens: i32,
    pub n_cached_tokens: i32,
    pub n_generated_tokens: i32,
    pub stop_reason: i32,
    pub prompt_seconds: f64,
    pub generate_seconds: f64,
    pub time_to_first_token_seconds: f64,
    pub prompt_tokens_per_second: f64,
    pub generated_tokens_per_second: f64,
}
pub type moelite_log_fn = Option<unsafe extern "C" fn(level: moelite_log_level, text: *const c_char, user_data: *mut c_void)>;
pub type moelite_progress_fn = Option<unsafe extern "C" fn(progress: f32, user_data: *mut c_void) -> c_int>;
pub type moelite_abort_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> c_int>;
pub type moelite_routing_fn = Option<unsafe extern "C" fn(layer: i32, pos0: i32, n_tokens: i32, k: i32, experts: *const i32, weights: *const f32, user_data: *mut c_void)>;
pub type moelite_piece_fn = Option<unsafe extern "C" fn(piece: *const c_char, len: usize, user_data: *mut c_void) -> c_int>;
pub type moelite_token_fn = Option<unsafe extern "C" fn(token: i32, text: *const c_char, len: usize, user_data: *mut c_void) -> c_int>;
pub type moelite_logits_fn = Option<unsafe extern "C" fn(logits: *mut f32, n_vocab: i32, history: *const i32, n_history: i32, user_data: *mut c_void) -> c_int>;
extern "C" {
    pub fn moelite_version_number() -> c_uint;
    pub fn moelite_version_string() -> *const c_char;
    pub fn moelite_status_name(status: moelite_status) -> *const c_char;
    pub fn moelite_last_error() -> *const c_char;
    pub fn moelite_set_log_callback(callback: moelite_log_fn, user_data: *mut c_void, min_level: moelite_log_level);
    pub fn moelite_model_params_create() -> *mut moelite_model_params;
    pub fn moelite_model_params_free(params: *mut moelite_model_params);
    pub fn moelite_model_params_set_threads(params: *mut moelite_model_params, n_threads: i32) -> moelite_status;
    pub fn moelite_model_params_set_backend(params: *mut moelite_model_params, backend: moelite_backend) -> moelite_status;
    pub fn moelite_model_params_set_expert_budget(params: *mut moelite_model_params, budget_bytes: u64) -> moelite_status;
    pub fn moelite_model_params_set_expert_budget_auto(params: *mut moelite_model_params, headroom_bytes: u64) -> moelite_status;
    pub fn moelite_model_params_set_expert_budget_fraction(params: *mut moelite_model_params, fraction: f64) -> moelite_status;
    pub fn moelite_model_params_set_expert_budget_text(params: *mut moelite_model_params, text: *const c_char) -> moelite_status;
    pub fn moelite_parse_size(text: *const c_char, out_bytes: *mut u64) -> moelite_status;
    pub fn moelite_model_params_set_cache_policy(params: *mut moelite_model_params, policy: *const c_char) -> moelite_status;
    pub fn moelite_model_params_set_expert_policy(params: *mut moelite_model_params, policy: *const c_char) -> moelite_status;
    pub fn moelite_model_params_set_predictor(params: *mut moelite_model_params, predictor: *const c_char) -> moelite_status;
    pub fn moelite_model_params_set_expert_predictor(params: *mut moelite_model_params, predictor: *const c_char) -> moelite_status;
    pub fn moelite_model_params_set_predictor_depth(params: *mut moelite_model_params, depth: i32) -> moelite_status;
    pub fn moelite_model_params_set_profile(params: *mut moelite_model_params, path: *const c_char) -> moelite_status;
    pub fn moelite_model_params_set_gating(params: *mut moelite_model_params, mode: *const c_char, threshold: f32) -> moelite_status;
    pub fn moelite_model_params_set_gating_penalty(params: *mut moelite_model_params, penalty: f32) -> moelite_status;
    pub fn moelite_model_params_set_gating_substitutes(params: *mut moelite_model_params, n: i32) -> moelite_status;
    pub fn moelite_model_params_set_expert_per_layer(params: *mut moelite_model_params, per_layer: i32) -> moelite_status;
    pub fn moelite_model_params_set_cache_allocation(params: *mut moelite_model_params, allocation: *const c_char) -> moelite_status;
    pub fn moelite_model_params_set_use_mmap(params: *mut moelite_model_params, use_mmap: i32) -> moelite_status;
    pub fn moelite_model_params_set_vocab_only(params: *mut moelite_model_params, vocab_only: i32) -> moelite_status;
    pub fn moelite_model_params_set_progress_callback(params: *mut moelite_model_params, callback: moelite_progress_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_model_params_set_chat_template(params: *mut moelite_model_params, chat_template: *const c_char) -> moelite_status;
    pub fn moelite_model_load(path: *const c_char, params: *const moelite_model_params, out_model: *mut *mut moelite_model) -> moelite_status;
    pub fn moelite_model_inspect(path: *const c_char, out_model: *mut *mut moelite_model) -> moelite_status;
    pub fn moelite_model_free(model: *mut moelite_model);
    pub fn moelite_model_get(model: *const moelite_model, key: moelite_model_key) -> i64;
    pub fn moelite_model_arch(model: *const moelite_model) -> *const c_char;
    pub fn moelite_model_name(model: *const moelite_model) -> *const c_char;
    pub fn moelite_model_expert_type(model: *const moelite_model) -> *const c_char;
    pub fn moelite_model_backend_name(model: *const moelite_model) -> *const c_char;
    pub fn moelite_model_meta_count(model: *const moelite_model) -> i32;
    pub fn moelite_model_meta_key(model: *const moelite_model, i: i32) -> *const c_char;
    pub fn moelite_model_meta_value(model: *const moelite_model, key: *const c_char, buf: *mut c_char, capacity: usize, len: *mut usize) -> moelite_status;
    pub fn moelite_model_measure_device_bandwidth(model: *mut moelite_model, gb_per_s: *mut f64) -> moelite_status;
    pub fn moelite_model_measure_expert_reads(model: *const moelite_model, bytes: u64, out: *mut moelite_expert_read_probe) -> moelite_status;
    pub fn moelite_pack_experts(model_path: *const c_char, out_path: *const c_char, progress: moelite_progress_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_model_expert_file(model: *const moelite_model) -> *const c_char;
    pub fn moelite_model_measure_expert_compression(model: *const moelite_model, level: i32, max_experts: i32, rows: *mut moelite_expert_compression, capacity: i32, n_rows: *mut i32) -> moelite_status;
    pub fn moelite_model_trace_begin(model: *mut moelite_model, path: *const c_char) -> moelite_status;
    pub fn moelite_model_trace_end(model: *mut moelite_model) -> moelite_status;
    pub fn moelite_supported_archs() -> *const c_char;
    pub fn moelite_model_expert_stats(model: *const moelite_model, layer: i32, out: *mut moelite_expert_stats) -> moelite_status;
    pub fn moelite_model_reset_expert_stats(model: *mut moelite_model);
    pub fn moelite_platform_get(field: moelite_platform_field) -> i64;
    pub fn moelite_platform_describe_json(buf: *mut c_char, buf_size: usize, needed: *mut usize) -> moelite_status;
    pub fn moelite_calibrate_params_create() -> *mut moelite_calibrate_params;
    pub fn moelite_calibrate_params_free(params: *mut moelite_calibrate_params);
    pub fn moelite_calibrate_params_set_window(params: *mut moelite_calibrate_params, window: i32) -> moelite_status;
    pub fn moelite_calibrate_params_set_stride(params: *mut moelite_calibrate_params, stride: i32) -> moelite_status;
    pub fn moelite_calibrate_params_set_holdout(params: *mut moelite_calibrate_params, share: f64) -> moelite_status;
    pub fn moelite_calibrate_params_set_sensitivity_tokens(params: *mut moelite_calibrate_params, tokens: i64) -> moelite_status;
    pub fn moelite_calibrate_params_set_progress_callback(params: *mut moelite_calibrate_params, callback: moelite_progress_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_calibrate(model: *mut moelite_model, tokens: *const i32, n_tokens: i32, params: *const moelite_calibrate_params, profile_path: *const c_char) -> moelite_status;
    pub fn moelite_context_params_create() -> *mut moelite_context_params;
    pub fn moelite_context_params_free(params: *mut moelite_context_params);
    pub fn moelite_context_params_set_n_ctx(params: *mut moelite_context_params, n_ctx: i32) -> moelite_status;
    pub fn moelite_context_params_set_n_batch(params: *mut moelite_context_params, n_batch: i32) -> moelite_status;
    pub fn moelite_context_params_set_n_seq(params: *mut moelite_context_params, n_seq: i32) -> moelite_status;
    pub fn moelite_context_params_set_abort_callback(params: *mut moelite_context_params, callback: moelite_abort_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_context_params_set_routing_callback(params: *mut moelite_context_params, callback: moelite_routing_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_context_params_set_quality_meter(params: *mut moelite_context_params, sample_rate: f64) -> moelite_status;
    pub fn moelite_context_params_set_quality_target(params: *mut moelite_context_params, target: *const c_char) -> moelite_status;
    pub fn moelite_context_params_set_quality_bounds(params: *mut moelite_context_params, min_threshold: f64, max_threshold: f64) -> moelite_status;
    pub fn moelite_context_quality_stats(ctx: *const moelite_context, out: *mut moelite_quality_stats) -> moelite_status;
    pub fn moelite_context_create(model: *mut moelite_model, params: *const moelite_context_params, out_ctx: *mut *mut moelite_context) -> moelite_status;
    pub fn moelite_context_free(ctx: *mut moelite_context);
    pub fn moelite_context_set_abort_callback(ctx: *mut moelite_context, callback: moelite_abort_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_eval(ctx: *mut moelite_context, tokens: *const i32, n_tokens: i32, logits_all: i32) -> moelite_status;
    pub fn moelite_eval_batch(ctx: *mut moelite_context, tokens: *const i32, seq_ids: *const i32, want_logits: *const u8, n_tokens: i32) -> moelite_status;
    pub fn moelite_get_logits(ctx: *const moelite_context, i: i32) -> *const f32;
    pub fn moelite_context_model(ctx: *const moelite_context) -> *mut moelite_model;
    pub fn moelite_context_kv_length(ctx: *const moelite_context) -> i32;
    pub fn moelite_context_n_ctx(ctx: *const moelite_context) -> i32;
    pub fn moelite_context_kv_bytes(ctx: *const moelite_context) -> u64;
    pub fn moelite_context_kv_reset(ctx: *mut moelite_context);
    pub fn moelite_context_kv_truncate(ctx: *mut moelite_context, n_keep: i32);
    pub fn moelite_context_save(ctx: *const moelite_context, path: *const c_char) -> moelite_status;
    pub fn moelite_context_load(ctx: *mut moelite_context, path: *const c_char) -> moelite_status;
    pub fn moelite_context_n_seq(ctx: *const moelite_context) -> i32;
    pub fn moelite_context_seq_length(ctx: *const moelite_context, seq: i32) -> i32;
    pub fn moelite_context_seq_truncate(ctx: *mut moelite_context, seq: i32, n_keep: i32) -> moelite_status;
    pub fn moelite_context_get_tokens(ctx: *const moelite_context, tokens: *mut i32, capacity: i32, n_tokens: *mut i32) -> moelite_status;
    pub fn moelite_context_expert_stats(ctx: *const moelite_context, layer: i32, out: *mut moelite_expert_stats) -> moelite_status;
    pub fn moelite_context_reset_expert_stats(ctx: *mut moelite_context);
    pub fn moelite_kv_length(ctx: *const moelite_context) -> i32;
    pub fn moelite_kv_reset(ctx: *mut moelite_context);
    pub fn moelite_kv_truncate(ctx: *mut moelite_context, n_keep: i32);
    pub fn moelite_tokenize(model: *const moelite_model, text: *const c_char, text_len: usize, flags: u32, tokens: *mut i32, capacity: i32, n_tokens: *mut i32) -> moelite_status;
    pub fn moelite_detokenize(model: *const moelite_model, tokens: *const i32, n_tokens: i32, flags: u32, text: *mut c_char, capacity: usize, text_len: *mut usize) -> moelite_status;
    pub fn moelite_token_bos(model: *const moelite_model) -> i32;
    pub fn moelite_token_eos(model: *const moelite_model) -> i32;
    pub fn moelite_token_is_end(model: *const moelite_model, token: i32) -> i32;
    pub fn moelite_token_attrs(model: *const moelite_model, token: i32) -> u32;
    pub fn moelite_token_text(model: *const moelite_model, token: i32) -> *const c_char;
    pub fn moelite_chat_format(model: *const moelite_model, messages: *const moelite_chat_message, n_messages: usize, add_assistant_prompt: i32, text: *mut c_char, capacity: usize, text_len: *mut usize) -> moelite_status;
    pub fn moelite_chat_template_kind(model: *const moelite_model) -> *const c_char;
    pub fn moelite_chat_tokenize(model: *const moelite_model, messages: *const moelite_chat_message, n_messages: usize, add_assistant_prompt: i32, tokens: *mut i32, capacity: i32, n_tokens: *mut i32) -> moelite_status;
    pub fn moelite_generate_params_create() -> *mut moelite_generate_params;
    pub fn moelite_generate_params_free(params: *mut moelite_generate_params);
    pub fn moelite_generate_params_set_max_tokens(p: *mut moelite_generate_params, n: i32) -> moelite_status;
    pub fn moelite_generate_params_set_temperature(p: *mut moelite_generate_params, t: f32) -> moelite_status;
    pub fn moelite_generate_params_set_top_k(p: *mut moelite_generate_params, k: i32) -> moelite_status;
    pub fn moelite_generate_params_set_top_p(p: *mut moelite_generate_params, top_p: f32) -> moelite_status;
    pub fn moelite_generate_params_set_min_p(p: *mut moelite_generate_params, min_p: f32) -> moelite_status;
    pub fn moelite_generate_params_set_repeat_penalty(p: *mut moelite_generate_params, penalty: f32, last_n: i32) -> moelite_status;
    pub fn moelite_generate_params_set_seed(p: *mut moelite_generate_params, seed: u64) -> moelite_status;
    pub fn moelite_generate_params_add_stop(p: *mut moelite_generate_params, stop: *const c_char) -> moelite_status;
    pub fn moelite_generate_params_set_logit_bias(p: *mut moelite_generate_params, token: i32, bias: f32) -> moelite_status;
    pub fn moelite_generate_params_clear_logit_bias(p: *mut moelite_generate_params) -> moelite_status;
    pub fn moelite_generate_params_set_parse_special(p: *mut moelite_generate_params, parse_special: i32) -> moelite_status;
    pub fn moelite_generate_params_set_callback(p: *mut moelite_generate_params, callback: moelite_piece_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_generate_params_set_token_callback(p: *mut moelite_generate_params, callback: moelite_token_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_generate_params_set_logits_callback(p: *mut moelite_generate_params, callback: moelite_logits_fn, user_data: *mut c_void) -> moelite_status;
    pub fn moelite_generate(ctx: *mut moelite_context, prompt: *const c_char, prompt_len: usize, params: *const moelite_generate_params, stats: *mut moelite_generate_stats) -> moelite_status;
    pub fn moelite_generate_tokens(ctx: *mut moelite_context, tokens: *const i32, n_tokens: i32, params: *const moelite_generate_params, stats: *mut moelite_generate_stats) -> moelite_status;
    pub fn moelite_sampler_create(params: *const moelite_generate_params, out: *mut *mut moelite_sampler) -> moelite_status;
    pub fn moelite_sampler_free(sampler: *mut moelite_sampler);
    pub fn moelite_sampler_accept(sampler: *mut moelite_sampler, tokens: *const i32, n_tokens: i32) -> moelite_status;
    pub fn moelite_sampler_sample(sampler: *mut moelite_sampler, ctx: *const moelite_context, i: i32, out_token: *mut i32) -> moelite_status;
    pub fn moelite_sampler_sample_logits(sampler: *mut moelite_sampler, logits: *const f32, n_vocab: i32, out_token: *mut i32) -> moelite_status;
    pub fn moelite_sampler_reset(sampler: *mut moelite_sampler);
    pub fn moelite_queue_create(ctx: *mut moelite_context, out: *mut *mut moelite_queue) -> moelite_status;
    pub fn moelite_queue_free(queue: *mut moelite_queue);
    pub fn moelite_queue_add(queue: *mut moelite_queue, prompt: *const i32, n_prompt: i32, params: *const moelite_generate_params, out_id: *mut i64) -> moelite_status;
    pub fn moelite_queue_step(queue: *mut moelite_queue, out_n_events: *mut i32) -> moelite_status;
    pub fn moelite_queue_event(queue: *const moelite_queue, i: i32, request_id: *mut i64, token: *mut i32, state: *mut i32) -> moelite_status;
    pub fn moelite_queue_waiting(queue: *const moelite_queue) -> i64;
    pub fn moelite_queue_running(queue: *const moelite_queue) -> i64;
    pub fn moelite_queue_finished(queue: *const moelite_queue) -> i64;
    pub fn moelite_queue_request_state(queue: *const moelite_queue, id: i64, state: *mut i32) -> moelite_status;
    pub fn moelite_queue_request_stats(queue: *const moelite_queue, id: i64, stats: *mut moelite_generate_stats) -> moelite_status;
    pub fn moelite_queue_request_tokens(queue: *const moelite_queue, id: i64, tokens: *mut i32, capacity: i32, n_tokens: *mut i32) -> moelite_status;
    pub fn moelite_queue_request_text(queue: *const moelite_queue, id: i64, buf: *mut c_char, capacity: usize, length: *mut usize) -> moelite_status;
    pub fn moelite_queue_cancel(queue: *mut moelite_queue, id: i64) -> moelite_status;
    pub fn moelite_queue_remove(queue: *mut moelite_queue, id: i64) -> moelite_status;
    pub fn moelite_plan_params_create() -> *mut moelite_plan_params;
    pub fn moelite_plan_params_free(params: *mut moelite_plan_params);
    pub fn moelite_plan_params_set_max_sequences(params: *mut moelite_plan_params, n: i32) -> moelite_status;
    pub fn moelite_plan_params_set_min_sequences(params: *mut moelite_plan_params, n: i32) -> moelite_status;
    pub fn moelite_plan_params_set_memory(params: *mut moelite_plan_params, bytes: u64) -> moelite_status;
    pub fn moelite_plan_params_set_headroom(params: *mut moelite_plan_params, bytes: u64) -> moelite_status;
    pub fn moelite_plan_params_set_expert_budget(params: *mut moelite_plan_params, bytes: u64) -> moelite_status;
    pub fn moelite_plan_params_set_expert_budget_text(params: *mut moelite_plan_params, text: *const c_char) -> moelite_status;
    pub fn moelite_plan_params_set_cache_allocation(params: *mut moelite_plan_params, allocation: *const c_char) -> moelite_status;
    pub fn moelite_plan_params_set_profile(params: *mut moelite_plan_params, path: *const c_char) -> moelite_status;
    pub fn moelite_plan_params_set_routing_trace(params: *mut moelite_plan_params, path: *const c_char) -> moelite_status;
    pub fn moelite_plan_params_set_routing(params: *mut moelite_plan_params, n_tokens: i32, n_moe_layers: i32, k: i32, experts: *const i32) -> moelite_status;
    pub fn moelite_plan_params_set_bandwidths(params: *mut moelite_plan_params, storage_gb_per_s: f64, compute_gb_per_s: f64) -> moelite_status;
    pub fn moelite_plan_batch(model: *const moelite_model, context_params: *const moelite_context_params, params: *const moelite_plan_params, out_plan: *mut *mut moelite_batch_plan) -> moelite_status;
    pub fn moelite_batch_plan_get(plan: *const moelite_batch_plan, key: moelite_batch_plan_key) -> i64;
    pub fn moelite_batch_plan_decode_tok_s(plan: *const moelite_batch_plan) -> f64;
    pub fn moelite_batch_plan_allocation(plan: *const moelite_batch_plan) -> *const c_char;
    pub fn moelite_batch_plan_reason(plan: *const moelite_batch_plan) -> *const c_char;
    pub fn moelite_batch_plan_json(plan: *const moelite_batch_plan) -> *const c_char;
    pub fn moelite_batch_plan_free(plan: *mut moelite_batch_plan);
}
