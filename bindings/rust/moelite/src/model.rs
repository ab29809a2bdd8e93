//! Loading a model and what it answers without a context: sizes, tokens, chat templates, the
//! expert store's counters.
use std::ffi::CStr;
use std::os::raw::c_char;
use std::path::Path;
use std::ptr::NonNull;

use moelite_sys as sys;

use crate::error::{c_count, c_string, check, Error, Result};
use crate::stats::ExpertStats;

/// Where the model computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The best backend present (CUDA, then Vulkan on a GPU, else the CPU).
    Auto,
    Cpu,
    Vulkan,
    Cuda,
}

/// How much memory the routed experts may take; the rest stream from storage.
#[derive(Debug, Clone, PartialEq)]
pub enum Budget {
    /// At most this many bytes of experts.
    Bytes(u64),
    /// A share of the experts that get a slot (1.0 keeps them all): the same as `Text("25%")`.
    Fraction(f64),
    /// What the machine can spare after the dense weights and a context, less `headroom` bytes.
    Auto { headroom: u64 },
    /// As a user writes it, parsed by the library so it means what it means in every tool and
    /// binding: "2GiB", "512MiB", "1.5G", "25%", "auto" or "none".
    Text(String),
}

/// Options of `Model::load` (all optional: the library's defaults otherwise). Plain data: build
/// it, clone it, use it from any thread.
#[derive(Debug, Clone, Default)]
pub struct ModelParams {
    threads: Option<i32>,
    backend: Option<Backend>,
    budget: Option<Budget>,
    policy: Option<String>,
    predictor: Option<String>,
    predictor_depth: Option<i32>,
    allocation: Option<String>,
    profile: Option<String>,
    gating: Option<(String, f32)>,
    gating_penalty: Option<f32>,
    gating_substitutes: Option<i32>,
    use_mmap: Option<bool>,
    vocab_only: Option<bool>,
    chat_template: Option<String>,
}

impl ModelParams {
    pub fn new() -> Self {
        Self::default()
    }
    /// Compute threads (default: physical cores, the big ones on big.LITTLE).
    pub fn threads(mut self, n: i32) -> Self {
        self.threads = Some(n);
        self
    }
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }
    /// Expert cache policy: "cyclic" (the default), "lru", "lfu", "decay", "static", "belady".
    pub fn policy(mut self, policy: &str) -> Self {
        self.policy = Some(policy.into());
        self
    }
    /// Expert predictor(s), e.g. "next-gate" or "next-gate,correlation" ("none" by default).
    pub fn predictor(mut self, predictor: &str) -> Self {
        self.predictor = Some(predictor.into());
        self
    }
    pub fn predictor_depth(mut self, depth: i32) -> Self {
        self.predictor_depth = Some(depth);
        self
    }
    /// How the budget is shared among layers: "auto", "global" (one pool), "uniform" (equal
    /// per-layer quotas), "dp" (a calibration profile's allocation).
    pub fn allocation(mut self, allocation: &str) -> Self {
        self.allocation = Some(allocation.into());
        self
    }
    /// A calibration profile (`moelite calibrate`).
    pub fn profile(mut self, path: &str) -> Self {
        self.profile = Some(path.into());
        self
    }
    /// Adaptive gating: "exact" (default), "sensitivity", "score", "cache-aware", with its threshold.
    pub fn gating(mut self, mode: &str, threshold: f32) -> Self {
        self.gating = Some((mode.into(), threshold));
        self
    }
    /// Cache-aware gating's penalty for non-resident experts (>= 1, default 4).
    pub fn gating_penalty(mut self, penalty: f32) -> Self {
        self.gating_penalty = Some(penalty);
        self
    }
    /// Cache-aware gating's substitution: a non-resident expert may be replaced by a resident one
    /// among the router's next `n` (default 0: off).
    pub fn gating_substitutes(mut self, n: i32) -> Self {
        self.gating_substitutes = Some(n);
        self
    }
    pub fn use_mmap(mut self, on: bool) -> Self {
        self.use_mmap = Some(on);
        self
    }
    /// Only the tokenizer and templates: no weights, no contexts.
    pub fn vocab_only(mut self, on: bool) -> Self {
        self.vocab_only = Some(on);
        self
    }
    /// A chat template to use instead of the model's own.
    pub fn chat_template(mut self, template: &str) -> Self {
        self.chat_template = Some(template.into());
        self
    }

    /// The C parameter object these options describe (freed when the guard drops).
    fn build(&self) -> Result<RawModelParams> {
        let raw = NonNull::new(unsafe { sys::moelite_model_params_create() })
            .ok_or_else(|| Error { status: crate::Status::OUT_OF_MEMORY, message: "model parameters".into() })?;
        let p = RawModelParams(raw);
        let ptr = p.0.as_ptr();
        unsafe {
            if let Some(n) = self.threads {
                check(sys::moelite_model_params_set_threads(ptr, n))?;
            }
            if let Some(b) = self.backend {
                let v = match b {
                    Backend::Auto => sys::MOELITE_BACKEND_AUTO,
                    Backend::Cpu => sys::MOELITE_BACKEND_CPU,
                    Backend::Vulkan => sys::MOELITE_BACKEND_VULKAN,
                    Backend::Cuda => sys::MOELITE_BACKEND_CUDA,
                };
                check(sys::moelite_model_params_set_backend(ptr, v))?;
            }
            match &self.budget {
                Some(Budget::Bytes(b)) => check(sys::moelite_model_params_set_expert_budget(ptr, *b))?,
                Some(Budget::Fraction(f)) => check(sys::moelite_model_params_set_expert_budget_fraction(ptr, *f))?,
                Some(Budget::Auto { headroom }) => check(sys::moelite_model_params_set_expert_budget_auto(ptr, *headroom))?,
                Some(Budget::Text(t)) => {
                    check(sys::moelite_model_params_set_expert_budget_text(ptr, c_string("budget", t)?.as_ptr()))?
                }
                None => {}
            }
            if let Some(s) = &self.policy {
                check(sys::moelite_model_params_set_expert_policy(ptr, c_string("policy", s)?.as_ptr()))?;
            }
            if let Some(s) = &self.predictor {
                check(sys::moelite_model_params_set_predictor(ptr, c_string("predictor", s)?.as_ptr()))?;
            }
            if let Some(d) = self.predictor_depth {
                check(sys::moelite_model_params_set_predictor_depth(ptr, d))?;
            }
            if let Some(s) = &self.allocation {
                check(sys::moelite_model_params_set_cache_allocation(ptr, c_string("allocation", s)?.as_ptr()))?;
            }
            if let Some(s) = &self.profile {
                check(sys::moelite_model_params_set_profile(ptr, c_string("profile", s)?.as_ptr()))?;
            }
            if let Some((mode, threshold)) = &self.gating {
                check(sys::moelite_model_params_set_gating(ptr, c_string("gating", mode)?.as_ptr(), *threshold))?;
            }
            if let Some(penalty) = self.gating_penalty {
                check(sys::moelite_model_params_set_gating_penalty(ptr, penalty))?;
            }
            if let Some(n) = self.gating_substitutes {
                check(sys::moelite_model_params_set_gating_substitutes(ptr, n))?;
            }
            if let Some(on) = self.use_mmap {
                check(sys::moelite_model_params_set_use_mmap(ptr, on as i32))?;
            }
            if let Some(on) = self.vocab_only {
                check(sys::moelite_model_params_set_vocab_only(ptr, on as i32))?;
            }
            if let Some(s) = &self.chat_template {
                check(sys::moelite_model_params_set_chat_template(ptr, c_string("chat template", s)?.as_ptr()))?;
            }
        }
        Ok(p)
    }
}

struct RawModelParams(NonNull<sys::moelite_model_params>);

impl Drop for RawModelParams {
    fn drop(&mut self) {
        unsafe { sys::moelite_model_params_free(self.0.as_ptr()) }
    }
}

/// Numeric properties of a loaded model (`Model::get`); the raw keys are in `moelite::sys`.
pub use sys::moelite_model_key as ModelKey;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// A loaded model. Immutable after loading, so it is shared freely between threads (`Send` and
/// `Sync`, as the header promises): wrap it in an `Arc` to create contexts on several threads.
/// Contexts keep the library's model alive on their own (it is reference-counted there), so a
/// `Context` does not borrow its `Model`.
pub struct Model {
    ptr: NonNull<sys::moelite_model>,
}

// The header: "A moelite_model is immutable after loading: any number of threads may query it and
// create contexts from it concurrently."
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { sys::moelite_model_free(self.ptr.as_ptr()) }
    }
}

fn path_cstring(path: &Path) -> Result<std::ffi::CString> {
    let s = path.to_str().ok_or_else(|| Error::invalid(format!("path {} is not UTF-8", path.display())))?;
    c_string("path", s)
}

fn static_str(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Calls `f(buf, capacity, &mut len)` once with a guess, again with the size asked for when
/// the library answers MOELITE_ERR_BUFFER_TOO_SMALL.
fn sized_bytes(
    guess: usize,
    mut f: impl FnMut(*mut c_char, usize, &mut usize) -> sys::moelite_status,
) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; guess.max(1)];
    let mut len = 0usize;
    let mut st = f(buf.as_mut_ptr() as *mut c_char, buf.len(), &mut len);
    if st == sys::MOELITE_ERR_BUFFER_TOO_SMALL {
        buf = vec![0u8; len.max(1)];
        st = f(buf.as_mut_ptr() as *mut c_char, buf.len(), &mut len);
    }
    check(st)?;
    buf.truncate(len);
    Ok(buf)
}

/// The same for token arrays.
fn sized_tokens(guess: usize, mut f: impl FnMut(*mut i32, i32, &mut i32) -> sys::moelite_status) -> Result<Vec<i32>> {
    let mut buf = vec![0i32; guess.max(1)];
    let mut n = 0i32;
    // The capacity never exceeds the buffer; `len as i32` would wrap (negative, or unrelated to it).
    let cap = |b: &Vec<i32>| i32::try_from(b.len()).unwrap_or(i32::MAX);
    let mut st = f(buf.as_mut_ptr(), cap(&buf), &mut n);
    if st == sys::MOELITE_ERR_BUFFER_TOO_SMALL {
        buf = vec![0i32; (n as usize).max(1)];
        st = f(buf.as_mut_ptr(), cap(&buf), &mut n);
    }
    check(st)?;
    buf.truncate(n as usize);
    Ok(buf)
}

impl Model {
    /// Loads a GGUF model. Errors carry the library's status (FILE_NOT_FOUND, GGUF_*,
    /// UNSUPPORTED_ARCH, BUDGET_TOO_SMALL, ...) and message.
    pub fn load(path: impl AsRef<Path>, params: &ModelParams) -> Result<Model> {
        let c_path = path_cstring(path.as_ref())?;
        let raw = params.build()?;
        let mut out: *mut sys::moelite_model = std::ptr::null_mut();
        check(unsafe { sys::moelite_model_load(c_path.as_ptr(), raw.0.as_ptr(), &mut out) })?;
        Ok(Model { ptr: NonNull::new(out).expect("moelite_model_load returned OK and no model") })
    }

    /// Reads a model's metadata and tensor directory only (no weights, no tokenizer work).
    pub fn inspect(path: impl AsRef<Path>) -> Result<Model> {
        let c_path = path_cstring(path.as_ref())?;
        let mut out: *mut sys::moelite_model = std::ptr::null_mut();
        check(unsafe { sys::moelite_model_inspect(c_path.as_ptr(), &mut out) })?;
        Ok(Model { ptr: NonNull::new(out).expect("moelite_model_inspect returned OK and no model") })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::moelite_model {
        self.ptr.as_ptr()
    }

    /// A numeric property (`sys::MOELITE_MODEL_*`), -1 for an unknown key.
    pub fn get(&self, key: ModelKey) -> i64 {
        unsafe { sys::moelite_model_get(self.ptr.as_ptr(), key) }
    }
    pub fn n_vocab(&self) -> i32 {
        self.get(sys::MOELITE_MODEL_N_VOCAB) as i32
    }
    pub fn n_layers(&self) -> i32 {
        self.get(sys::MOELITE_MODEL_N_LAYERS) as i32
    }
    pub fn n_ctx_train(&self) -> i32 {
        self.get(sys::MOELITE_MODEL_N_CTX_TRAIN) as i32
    }
    /// The expert budget in use (0: every expert resident).
    pub fn expert_budget(&self) -> u64 {
        self.get(sys::MOELITE_MODEL_EXPERT_BUDGET).max(0) as u64
    }
    /// Expert slots: of the store's pool under a budget, else every routed expert.
    pub fn expert_slots(&self) -> i64 {
        self.get(sys::MOELITE_MODEL_EXPERT_SLOTS)
    }
    pub fn arch(&self) -> String {
        static_str(unsafe { sys::moelite_model_arch(self.ptr.as_ptr()) })
    }
    pub fn name(&self) -> String {
        static_str(unsafe { sys::moelite_model_name(self.ptr.as_ptr()) })
    }
    pub fn backend_name(&self) -> String {
        static_str(unsafe { sys::moelite_model_backend_name(self.ptr.as_ptr()) })
    }

    /// Token ids of `text`; `add_special` adds BOS/EOS as the model asks, `parse_special` turns
    /// control-token text (`<|im_end|>`) into those tokens.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<i32>> {
        let mut flags = 0u32;
        if add_special {
            flags |= sys::MOELITE_TOKENIZE_ADD_SPECIAL as u32;
        }
        if parse_special {
            flags |= sys::MOELITE_TOKENIZE_PARSE_SPECIAL as u32;
        }
        sized_tokens(text.len() + 8, |buf, cap, n| unsafe {
            sys::moelite_tokenize(self.ptr.as_ptr(), text.as_ptr() as *const c_char, text.len(), flags, buf, cap, n)
        })
    }

    /// The bytes `tokens` stand for (one token's may be part of a UTF-8 character).
    pub fn detokenize_bytes(&self, tokens: &[i32], render_special: bool) -> Result<Vec<u8>> {
        let flags = if render_special { sys::MOELITE_DETOKENIZE_RENDER_SPECIAL as u32 } else { 0 };
        let n = c_count("tokens", tokens.len())?;
        sized_bytes(tokens.len() * 8 + 16, |buf, cap, len| unsafe {
            sys::moelite_detokenize(self.ptr.as_ptr(), tokens.as_ptr(), n, flags, buf, cap, len)
        })
    }

    /// The text of `tokens` (invalid UTF-8, as from a cut-off character, becomes U+FFFD).
    pub fn detokenize(&self, tokens: &[i32], render_special: bool) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.detokenize_bytes(tokens, render_special)?).into_owned())
    }

    pub fn token_bos(&self) -> i32 {
        unsafe { sys::moelite_token_bos(self.ptr.as_ptr()) }
    }
    pub fn token_eos(&self) -> i32 {
        unsafe { sys::moelite_token_eos(self.ptr.as_ptr()) }
    }
    /// Whether generation stops at `token` (end of turn, end of text).
    pub fn token_is_end(&self, token: i32) -> bool {
        unsafe { sys::moelite_token_is_end(self.ptr.as_ptr(), token) != 0 }
    }

    fn raw_messages(messages: &[ChatMessage]) -> Result<(Vec<std::ffi::CString>, Vec<sys::moelite_chat_message>)> {
        let mut strings = Vec::with_capacity(messages.len() * 2);
        for m in messages {
            strings.push(c_string("role", &m.role)?);
            strings.push(c_string("content", &m.content)?);
        }
        let raw = strings
            .chunks(2)
            .map(|p| sys::moelite_chat_message { role: p[0].as_ptr(), content: p[1].as_ptr() })
            .collect();
        Ok((strings, raw))
    }

    /// The conversation formatted with the model's chat template, ending with the assistant's
    /// turn opened when `add_assistant_prompt`.
    pub fn chat_format(&self, messages: &[ChatMessage], add_assistant_prompt: bool) -> Result<String> {
        let (_keep, raw) = Self::raw_messages(messages)?;
        let guess = messages.iter().map(|m| m.content.len() + m.role.len() + 32).sum::<usize>() + 64;
        let bytes = sized_bytes(guess, |buf, cap, len| unsafe {
            sys::moelite_chat_format(self.ptr.as_ptr(), raw.as_ptr(), raw.len(), add_assistant_prompt as i32, buf, cap, len)
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The conversation's tokens: message text stays text even where it spells a control token.
    pub fn chat_tokenize(&self, messages: &[ChatMessage], add_assistant_prompt: bool) -> Result<Vec<i32>> {
        let (_keep, raw) = Self::raw_messages(messages)?;
        let guess = messages.iter().map(|m| m.content.len() + 16).sum::<usize>() + 64;
        sized_tokens(guess, |buf, cap, n| unsafe {
            sys::moelite_chat_tokenize(self.ptr.as_ptr(), raw.as_ptr(), raw.len(), add_assistant_prompt as i32, buf, cap, n)
        })
    }

    /// The expert store's counters of every context, for one layer or all (`None`).
    pub fn expert_stats(&self, layer: Option<i32>) -> Result<ExpertStats> {
        let mut s = ExpertStats::raw_zeroed();
        check(unsafe { sys::moelite_model_expert_stats(self.ptr.as_ptr(), layer.unwrap_or(-1), &mut s) })?;
        Ok(ExpertStats::from(s))
    }

    /// Starts recording a timeline of the model's work (routing, expert reads, computation, waits,
    /// prefetches) as Chrome trace JSON that Perfetto opens; IO at once when `path` cannot be
    /// written. Written by `trace_end` (or when the model is dropped).
    pub fn trace_begin(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = path_cstring(path.as_ref())?;
        // Thread-safe in the library (its own lock).
        check(unsafe { sys::moelite_model_trace_begin(self.ptr.as_ptr(), p.as_ptr()) })
    }

    /// Stops the timeline and writes it.
    pub fn trace_end(&self) -> Result<()> {
        check(unsafe { sys::moelite_model_trace_end(self.ptr.as_ptr()) })
    }

    /// Zeroes the model's counters (not the contexts' own).
    pub fn reset_expert_stats(&self) {
        // The library locks its counters: this is safe from any thread.
        unsafe { sys::moelite_model_reset_expert_stats(self.ptr.as_ptr()) }
    }
}
