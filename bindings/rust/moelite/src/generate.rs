//! Generation: sampling settings, the library's own generation loop (`Context::generate_text`)
//! and a streaming iterator over generated tokens (`Context::generate`).
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::NonNull;

use moelite_sys as sys;

use crate::context::Context;
use crate::error::{c_count, c_string, check, Error, Result, Status};

/// Sampling and stopping settings (the library's defaults where unset: 256 tokens, temperature
/// 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.1 over 64 tokens).
#[derive(Debug, Clone, Default)]
pub struct GenerateParams {
    max_tokens: Option<i32>,
    temperature: Option<f32>,
    top_k: Option<i32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repeat_penalty: Option<(f32, i32)>,
    seed: Option<u64>,
    stops: Vec<String>,
}

impl GenerateParams {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn max_tokens(mut self, n: i32) -> Self {
        self.max_tokens = Some(n);
        self
    }
    /// 0 is greedy.
    pub fn temperature(mut self, t: f32) -> Self {
        self.temperature = Some(t);
        self
    }
    pub fn top_k(mut self, k: i32) -> Self {
        self.top_k = Some(k);
        self
    }
    pub fn top_p(mut self, p: f32) -> Self {
        self.top_p = Some(p);
        self
    }
    pub fn min_p(mut self, p: f32) -> Self {
        self.min_p = Some(p);
        self
    }
    pub fn repeat_penalty(mut self, penalty: f32, last_n: i32) -> Self {
        self.repeat_penalty = Some((penalty, last_n));
        self
    }
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Generation ends before this text; it is not part of the output.
    pub fn stop(mut self, s: &str) -> Self {
        self.stops.push(s.into());
        self
    }

    pub(crate) fn build(&self) -> Result<RawGenerateParams> {
        let p = RawGenerateParams(
            NonNull::new(unsafe { sys::moelite_generate_params_create() })
                .ok_or_else(|| Error { status: Status::OUT_OF_MEMORY, message: "generate parameters".into() })?,
        );
        let ptr = p.0.as_ptr();
        unsafe {
            if let Some(n) = self.max_tokens {
                check(sys::moelite_generate_params_set_max_tokens(ptr, n))?;
            }
            if let Some(t) = self.temperature {
                check(sys::moelite_generate_params_set_temperature(ptr, t))?;
            }
            if let Some(k) = self.top_k {
                check(sys::moelite_generate_params_set_top_k(ptr, k))?;
            }
            if let Some(v) = self.top_p {
                check(sys::moelite_generate_params_set_top_p(ptr, v))?;
            }
            if let Some(v) = self.min_p {
                check(sys::moelite_generate_params_set_min_p(ptr, v))?;
            }
            if let Some((penalty, last_n)) = self.repeat_penalty {
                check(sys::moelite_generate_params_set_repeat_penalty(ptr, penalty, last_n))?;
            }
            if let Some(s) = self.seed {
                check(sys::moelite_generate_params_set_seed(ptr, s))?;
            }
            for s in &self.stops {
                check(sys::moelite_generate_params_add_stop(ptr, c_string("stop string", s)?.as_ptr()))?;
            }
        }
        Ok(p)
    }
}

pub(crate) struct RawGenerateParams(pub(crate) NonNull<sys::moelite_generate_params>);

impl Drop for RawGenerateParams {
    fn drop(&mut self) {
        unsafe { sys::moelite_generate_params_free(self.0.as_ptr()) }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end token.
    EndToken,
    MaxTokens,
    /// A stop string appeared.
    StopString,
    Aborted,
    ContextFull,
    Error,
}

impl StopReason {
    pub(crate) fn from_raw(v: i32) -> StopReason {
        match v {
            sys::MOELITE_STOP_END_TOKEN => StopReason::EndToken,
            sys::MOELITE_STOP_MAX_TOKENS => StopReason::MaxTokens,
            sys::MOELITE_STOP_STRING => StopReason::StopString,
            sys::MOELITE_STOP_ABORTED => StopReason::Aborted,
            sys::MOELITE_STOP_CONTEXT_FULL => StopReason::ContextFull,
            _ => StopReason::Error,
        }
    }
}

/// Counts and timing of one `generate_text` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateStats {
    pub prompt_tokens: i32,
    pub cached_tokens: i32,
    pub generated_tokens: i32,
    pub stop_reason: StopReason,
    pub prompt_seconds: f64,
    pub generate_seconds: f64,
    pub time_to_first_token_seconds: f64,
    pub prompt_tokens_per_second: f64,
    pub generated_tokens_per_second: f64,
}

unsafe extern "C" fn append_piece(piece: *const c_char, len: usize, user: *mut c_void) -> c_int {
    let out = &mut *(user as *mut Vec<u8>);
    out.extend_from_slice(std::slice::from_raw_parts(piece as *const u8, len));
    1
}

/// Draws tokens from a context's logits with the settings of `GenerateParams`; with the same
/// seed, a loop of `sample` and `Context::eval` draws exactly what the library's own generation
/// draws.
pub struct Sampler {
    ptr: NonNull<sys::moelite_sampler>,
}

unsafe impl Send for Sampler {}

impl Drop for Sampler {
    fn drop(&mut self) {
        unsafe { sys::moelite_sampler_free(self.ptr.as_ptr()) }
    }
}

impl Sampler {
    pub fn new(params: &GenerateParams) -> Result<Sampler> {
        let raw = params.build()?;
        let mut out: *mut sys::moelite_sampler = std::ptr::null_mut();
        check(unsafe { sys::moelite_sampler_create(raw.0.as_ptr(), &mut out) })?;
        Ok(Sampler { ptr: NonNull::new(out).expect("moelite_sampler_create returned OK and no sampler") })
    }
    /// Adds tokens to the history the repetition penalty sees (e.g. the prompt).
    pub fn accept(&mut self, tokens: &[i32]) -> Result<()> {
        let n = c_count("tokens", tokens.len())?;
        check(unsafe { sys::moelite_sampler_accept(self.ptr.as_ptr(), tokens.as_ptr(), n) })
    }
    /// A token from row `i` of the context's last evaluation (-1: the last), accepted.
    pub fn sample(&mut self, ctx: &Context, i: i32) -> Result<i32> {
        let mut t = 0i32;
        check(unsafe { sys::moelite_sampler_sample(self.ptr.as_ptr(), ctx.as_ptr(), i, &mut t) })?;
        Ok(t)
    }
    /// A token from any logits.
    pub fn sample_logits(&mut self, logits: &[f32]) -> Result<i32> {
        let mut t = 0i32;
        let n = c_count("logits", logits.len())?;
        check(unsafe { sys::moelite_sampler_sample_logits(self.ptr.as_ptr(), logits.as_ptr(), n, &mut t) })?;
        Ok(t)
    }
}

/// One generated token and the text it completes (empty while a character or a possible stop
/// string is incomplete; such text comes with a later token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: i32,
    pub text: String,
}

/// The tokens of a generation, one per `next()`, each computed when asked for: dropping the
/// iterator stops generating. Ends at an end token, a stop string or `max_tokens`
/// (`stop_reason()` says which); an error ends it after yielding the error.
pub struct Generation<'c> {
    ctx: &'c mut Context,
    model: *mut sys::moelite_model,
    sampler: Sampler,
    left: i32,
    to_eval: Option<i32>,
    pending: Vec<u8>, // bytes of an incomplete UTF-8 character
    held: String,     // text that may begin a stop string
    stops: Vec<String>,
    stop_reason: Option<StopReason>,
}

impl Context {
    /// The library's generation loop: the completion of `prompt` (tokenized with control-token
    /// text parsed), reusing the cache's common prefix with it.
    pub fn generate_text(&mut self, prompt: &str, params: &GenerateParams) -> Result<(String, GenerateStats)> {
        let raw = params.build()?;
        let mut out: Vec<u8> = Vec::new();
        let mut stats = sys::moelite_generate_stats {
            struct_size: std::mem::size_of::<sys::moelite_generate_stats>(),
            n_prompt_tokens: 0,
            n_cached_tokens: 0,
            n_generated_tokens: 0,
            stop_reason: 0,
            prompt_seconds: 0.0,
            generate_seconds: 0.0,
            time_to_first_token_seconds: 0.0,
            prompt_tokens_per_second: 0.0,
            generated_tokens_per_second: 0.0,
        };
        unsafe {
            check(sys::moelite_generate_params_set_callback(
                raw.0.as_ptr(),
                Some(append_piece),
                &mut out as *mut Vec<u8> as *mut c_void,
            ))?;
            check(sys::moelite_generate(
                self.as_ptr(),
                prompt.as_ptr() as *const c_char,
                prompt.len(),
                raw.0.as_ptr(),
                &mut stats,
            ))?;
        }
        let stats = GenerateStats {
            prompt_tokens: stats.n_prompt_tokens,
            cached_tokens: stats.n_cached_tokens,
            generated_tokens: stats.n_generated_tokens,
            stop_reason: StopReason::from_raw(stats.stop_reason),
            prompt_seconds: stats.prompt_seconds,
            generate_seconds: stats.generate_seconds,
            time_to_first_token_seconds: stats.time_to_first_token_seconds,
            prompt_tokens_per_second: stats.prompt_tokens_per_second,
            generated_tokens_per_second: stats.generated_tokens_per_second,
        };
        Ok((String::from_utf8_lossy(&out).into_owned(), stats))
    }

    /// Streams the completion of `prompt` token by token. The cache's common prefix with the
    /// prompt is kept and the rest evaluated now; each `next()` then evaluates the previous token
    /// and draws the next, so after the last one the cache holds the prompt and every generated
    /// token but the last (as after `generate_text`).
    pub fn generate(&mut self, prompt: &[i32], params: &GenerateParams) -> Result<Generation<'_>> {
        if prompt.is_empty() {
            return Err(Error::invalid("generate: the prompt is empty"));
        }
        let cached = self.tokens()?;
        // At least the prompt's last token is evaluated, so its logits are fresh.
        let keep = cached.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        self.kv_truncate(keep as i32);
        self.eval(&prompt[keep..], false)?;
        let mut sampler = Sampler::new(params)?;
        sampler.accept(prompt)?;
        let model = unsafe { sys::moelite_context_model(self.as_ptr()) };
        Ok(Generation {
            ctx: self,
            model,
            sampler,
            left: params.max_tokens.unwrap_or(256),
            to_eval: None,
            pending: Vec::new(),
            held: String::new(),
            stops: params.stops.clone(),
            stop_reason: None,
        })
    }
}

impl Generation<'_> {
    /// Why it ended (`None` while it goes on).
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop_reason
    }

    fn finish(&mut self, why: StopReason) {
        self.stop_reason = Some(why);
    }

    /// Text this token completes: whole characters only, and none that may begin a stop string
    /// unless `last`. Returns the text and whether a stop string ended it.
    fn release_text(&mut self, bytes: &[u8], last: bool) -> (String, bool) {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(), // a character still incomplete
            Err(_) => self.pending.len(),                         // invalid bytes: lossy below
        };
        let ready: Vec<u8> = self.pending.drain(..valid).collect();
        let mut text = std::mem::take(&mut self.held) + &String::from_utf8_lossy(&ready);
        if let Some(at) = self.stops.iter().filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(at);
            return (text, true);
        }
        if !last {
            // Hold back the longest end of the text that begins some stop string.
            let hold = self
                .stops
                .iter()
                .flat_map(|s| (1..s.len()).rev().filter(move |&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
                .filter(|p| text.ends_with(p))
                .map(|p| p.len())
                .max()
                .unwrap_or(0);
            self.held = text.split_off(text.len() - hold);
        }
        (text, false)
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<Token>;

    fn next(&mut self) -> Option<Result<Token>> {
        if self.stop_reason.is_some() {
            return None;
        }
        if self.left <= 0 {
            self.finish(StopReason::MaxTokens);
            return None;
        }
        if let Some(t) = self.to_eval.take() {
            if let Err(e) = self.ctx.eval(&[t], false) {
                self.finish(if e.status == Status::CONTEXT_FULL {
                    StopReason::ContextFull
                } else if e.status == Status::ABORTED {
                    StopReason::Aborted
                } else {
                    StopReason::Error
                });
                return Some(Err(e));
            }
        }
        let token = match self.sampler.sample(self.ctx, -1) {
            Ok(t) => t,
            Err(e) => {
                self.finish(StopReason::Error);
                return Some(Err(e));
            }
        };
        if unsafe { sys::moelite_token_is_end(self.model, token) } != 0 {
            self.finish(StopReason::EndToken);
            // Text held back for a stop string that never came is still the model's output.
            let (text, _) = self.release_text(&[], true);
            return if text.is_empty() { None } else { Some(Ok(Token { id: token, text })) };
        }
        self.left -= 1;
        let mut bytes = Vec::new();
        let mut len = 0usize;
        let mut buf = [0u8; 256];
        let st = unsafe {
            sys::moelite_detokenize(self.model, &token, 1, 0, buf.as_mut_ptr() as *mut c_char, buf.len(), &mut len)
        };
        if st == sys::MOELITE_ERR_BUFFER_TOO_SMALL {
            bytes.resize(len, 0);
            let st2 = unsafe {
                sys::moelite_detokenize(self.model, &token, 1, 0, bytes.as_mut_ptr() as *mut c_char, bytes.len(), &mut len)
            };
            if let Err(e) = check(st2) {
                self.finish(StopReason::Error);
                return Some(Err(e));
            }
        } else if let Err(e) = check(st) {
            self.finish(StopReason::Error);
            return Some(Err(e));
        } else {
            bytes.extend_from_slice(&buf[..len]);
        }
        let (text, stopped) = self.release_text(&bytes, self.left == 0);
        if stopped {
            self.finish(StopReason::StopString);
        } else {
            self.to_eval = Some(token);
        }
        Some(Ok(Token { id: token, text }))
    }
}
