//! Contexts: the KV caches of one or more sequences, evaluation, logits, sessions.
use std::os::raw::{c_int, c_void};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use moelite_sys as sys;

use crate::error::{c_count, c_string, check, Error, Result, Status};
use crate::model::Model;
use crate::stats::{ExpertStats, QualityStats};

/// Options of `Context::new` (the library's defaults where unset).
#[derive(Debug, Clone, Default)]
pub struct ContextParams {
    n_ctx: Option<i32>,
    n_batch: Option<i32>,
    n_seq: Option<i32>,
    quality_sample: Option<f64>,
    quality_target: Option<String>,
    quality_bounds: Option<(f64, f64)>,
}

impl ContextParams {
    pub fn new() -> Self {
        Self::default()
    }
    /// Positions each sequence holds (default: the training context, at most 4096).
    pub fn n_ctx(mut self, n: i32) -> Self {
        self.n_ctx = Some(n);
        self
    }
    /// Most tokens one forward pass takes.
    pub fn n_batch(mut self, n: i32) -> Self {
        self.n_batch = Some(n);
        self
    }
    /// Sequences the context holds (each its own KV cache), for `eval_batch`.
    pub fn n_seq(mut self, n: i32) -> Self {
        self.n_seq = Some(n);
        self
    }
    /// The quality meter, for lossy gating: the share of decode steps in [0, 1] evaluated a second
    /// time with exact routing and compared (KL, top-1 agreement); see `Context::quality_stats`.
    pub fn quality_sample(mut self, rate: f64) -> Self {
        self.quality_sample = Some(rate);
        self
    }
    /// The quality governor: the context moves its gating threshold to hold what gating costs at
    /// `target`, a perplexity rise ("1%", "0.5%") or "kl:0.01" nats per token. Needs
    /// "sensitivity" or "cache-aware" gating, whose profile then becomes optional.
    pub fn quality_target(mut self, target: &str) -> Self {
        self.quality_target = Some(target.into());
        self
    }
    /// The thresholds the governor may use (min >= 0, max >= min).
    pub fn quality_bounds(mut self, min: f64, max: f64) -> Self {
        self.quality_bounds = Some((min, max));
        self
    }
}

/// A context of a model. Used by one thread at a time (`Send`, not `Sync`), as the header asks;
/// contexts of one model on different threads evaluate at the same time where the library allows
/// (CPU, Vulkan, CUDA) and take turns otherwise, with the same results either way.
pub struct Context {
    ptr: NonNull<sys::moelite_context>,
    n_vocab: usize,
    abort_flag: Option<Arc<AtomicBool>>,
}

// The header: "A moelite_context must be used by one thread at a time."
unsafe impl Send for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        unsafe { sys::moelite_context_free(self.ptr.as_ptr()) }
    }
}

struct RawContextParams(NonNull<sys::moelite_context_params>);

impl Drop for RawContextParams {
    fn drop(&mut self) {
        unsafe { sys::moelite_context_params_free(self.0.as_ptr()) }
    }
}

unsafe extern "C" fn abort_when_set(user: *mut c_void) -> c_int {
    // `user` is the Arc<AtomicBool> the context holds for as long as the callback is installed.
    let flag = &*(user as *const AtomicBool);
    flag.load(Ordering::Relaxed) as c_int
}

impl Context {
    pub fn new(model: &Model, params: &ContextParams) -> Result<Context> {
        let raw = NonNull::new(unsafe { sys::moelite_context_params_create() })
            .ok_or_else(|| Error { status: Status::OUT_OF_MEMORY, message: "context parameters".into() })?;
        let raw = RawContextParams(raw);
        unsafe {
            if let Some(n) = params.n_ctx {
                check(sys::moelite_context_params_set_n_ctx(raw.0.as_ptr(), n))?;
            }
            if let Some(n) = params.n_batch {
                check(sys::moelite_context_params_set_n_batch(raw.0.as_ptr(), n))?;
            }
            if let Some(n) = params.n_seq {
                check(sys::moelite_context_params_set_n_seq(raw.0.as_ptr(), n))?;
            }
            if let Some(rate) = params.quality_sample {
                check(sys::moelite_context_params_set_quality_meter(raw.0.as_ptr(), rate))?;
            }
            if let Some(t) = &params.quality_target {
                let t = c_string("quality target", t)?;
                check(sys::moelite_context_params_set_quality_target(raw.0.as_ptr(), t.as_ptr()))?;
            }
            if let Some((min, max)) = params.quality_bounds {
                check(sys::moelite_context_params_set_quality_bounds(raw.0.as_ptr(), min, max))?;
            }
        }
        let mut out: *mut sys::moelite_context = std::ptr::null_mut();
        check(unsafe { sys::moelite_context_create(model.as_ptr(), raw.0.as_ptr(), &mut out) })?;
        Ok(Context {
            ptr: NonNull::new(out).expect("moelite_context_create returned OK and no context"),
            n_vocab: model.n_vocab().max(0) as usize,
            abort_flag: None,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::moelite_context {
        self.ptr.as_ptr()
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Stops evaluations of this context once `flag` is set (from any thread): they return
    /// `Status::ABORTED` and leave the sequence as it was. `None` removes it.
    pub fn set_abort_flag(&mut self, flag: Option<Arc<AtomicBool>>) -> Result<()> {
        let (cb, user): (sys::moelite_abort_fn, *mut c_void) = match &flag {
            Some(f) => (Some(abort_when_set), Arc::as_ptr(f) as *mut c_void),
            None => (None, std::ptr::null_mut()),
        };
        check(unsafe { sys::moelite_context_set_abort_callback(self.ptr.as_ptr(), cb, user) })?;
        self.abort_flag = flag; // kept alive while the library may call back with it
        Ok(())
    }

    /// Appends `tokens` to sequence 0 and evaluates them; the last token's logits are kept
    /// (every token's with `logits_all`). On error the sequence is unchanged.
    pub fn eval(&mut self, tokens: &[i32], logits_all: bool) -> Result<()> {
        let n = c_count("tokens", tokens.len())?;
        check(unsafe { sys::moelite_eval(self.ptr.as_ptr(), tokens.as_ptr(), n, logits_all as i32) })
    }

    /// Tokens of several sequences in one pass: token i goes to sequence `seq_ids[i]`. Logits are
    /// kept for the tokens with `want_logits[i]` (`None`: the last token of each sequence); each
    /// sequence's logits are bitwise those of evaluating it alone.
    pub fn eval_batch(&mut self, tokens: &[i32], seq_ids: &[i32], want_logits: Option<&[bool]>) -> Result<()> {
        if seq_ids.len() != tokens.len() || want_logits.map_or(false, |w| w.len() != tokens.len()) {
            return Err(Error::invalid("eval_batch: tokens, seq_ids and want_logits differ in length"));
        }
        let n = c_count("tokens", tokens.len())?;
        let want: Option<Vec<u8>> = want_logits.map(|w| w.iter().map(|&b| b as u8).collect());
        let want_ptr = want.as_ref().map_or(std::ptr::null(), |w| w.as_ptr());
        check(unsafe { sys::moelite_eval_batch(self.ptr.as_ptr(), tokens.as_ptr(), seq_ids.as_ptr(), want_ptr, n) })
    }

    /// Logits of row `i` of the last evaluation (negative counts from the end; -1: the last),
    /// `None` when that row has none.
    pub fn logits(&self, i: i32) -> Option<&[f32]> {
        let p = unsafe { sys::moelite_get_logits(self.ptr.as_ptr(), i) };
        if p.is_null() {
            None
        } else {
            // Valid until the next evaluation, which needs &mut self.
            Some(unsafe { std::slice::from_raw_parts(p, self.n_vocab) })
        }
    }

    pub fn kv_length(&self) -> i32 {
        unsafe { sys::moelite_context_kv_length(self.ptr.as_ptr()) }
    }
    pub fn n_ctx(&self) -> i32 {
        unsafe { sys::moelite_context_n_ctx(self.ptr.as_ptr()) }
    }
    pub fn kv_reset(&mut self) {
        unsafe { sys::moelite_context_kv_reset(self.ptr.as_ptr()) }
    }
    pub fn kv_truncate(&mut self, n_keep: i32) {
        unsafe { sys::moelite_context_kv_truncate(self.ptr.as_ptr(), n_keep) }
    }
    pub fn n_seq(&self) -> i32 {
        unsafe { sys::moelite_context_n_seq(self.ptr.as_ptr()) }
    }
    pub fn seq_length(&self, seq: i32) -> i32 {
        unsafe { sys::moelite_context_seq_length(self.ptr.as_ptr(), seq) }
    }
    pub fn seq_truncate(&mut self, seq: i32, n_keep: i32) -> Result<()> {
        check(unsafe { sys::moelite_context_seq_truncate(self.ptr.as_ptr(), seq, n_keep) })
    }

    /// The tokens sequence 0's cache holds, in order.
    pub fn tokens(&self) -> Result<Vec<i32>> {
        let mut buf = vec![0i32; self.kv_length().max(1) as usize];
        let mut n = 0i32;
        check(unsafe { sys::moelite_context_get_tokens(self.ptr.as_ptr(), buf.as_mut_ptr(), buf.len() as i32, &mut n) })?;
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Writes every sequence's tokens and cache to `path` (atomically; zstd where available).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = path.as_ref().to_str().ok_or_else(|| Error::invalid("path is not UTF-8"))?;
        check(unsafe { sys::moelite_context_save(self.ptr.as_ptr(), c_string("path", p)?.as_ptr()) })
    }

    /// Restores a saved session (checked whole before anything changes: BAD_SESSION,
    /// SESSION_MISMATCH).
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = path.as_ref().to_str().ok_or_else(|| Error::invalid("path is not UTF-8"))?;
        check(unsafe { sys::moelite_context_load(self.ptr.as_ptr(), c_string("path", p)?.as_ptr()) })
    }

    /// This context's own expert-store counters, for one layer or all (`None`).
    pub fn expert_stats(&self, layer: Option<i32>) -> Result<ExpertStats> {
        let mut s = ExpertStats::raw_zeroed();
        check(unsafe { sys::moelite_context_expert_stats(self.ptr.as_ptr(), layer.unwrap_or(-1), &mut s) })?;
        Ok(ExpertStats::from(s))
    }

    /// What lossy gating cost this context so far: the quality meter's KL and top-1 agreement
    /// against exact routing, the sensitivity model's predicted loss, the governor's threshold
    /// and target. All zero with exact gating.
    pub fn quality_stats(&self) -> Result<QualityStats> {
        let mut s = QualityStats::raw_zeroed();
        check(unsafe { sys::moelite_context_quality_stats(self.ptr.as_ptr(), &mut s) })?;
        Ok(QualityStats::from(s))
    }

    pub fn reset_expert_stats(&mut self) {
        unsafe { sys::moelite_context_reset_expert_stats(self.ptr.as_ptr()) }
    }
}
