//! Safe Rust bindings of moelite, an SDK that runs Mixture-of-Experts language models on devices
//! whose memory is smaller than the model: the dense weights stay resident, a memory budget of
//! experts is cached, the rest stream from storage, and the results are those of a resident run.
//!
//! ```no_run
//! use moelite::{Budget, Context, ContextParams, GenerateParams, Model, ModelParams};
//! let model = Model::load("model.gguf", &ModelParams::new().budget(Budget::Fraction(0.25)))?;
//! let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(2048))?;
//! let prompt = model.tokenize("The capital of France is", true, false)?;
//! for token in ctx.generate(&prompt, &GenerateParams::new().max_tokens(32))? {
//!     print!("{}", token?.text);
//! }
//! println!("\nexpert hit rate {:.2}", ctx.expert_stats(None)?.hit_rate());
//! # Ok::<(), moelite::Error>(())
//! ```
//!
//! Threads: a `Model` is `Send + Sync` (share it in an `Arc`); a `Context` is `Send` and used by
//! one thread at a time. Every fallible call returns `Result<_, Error>` with the library's
//! status and message; no call panics on bad input.
mod context;
mod error;
mod generate;
mod model;
mod queue;
mod stats;

pub use context::{Context, ContextParams};
pub use error::{Error, Result, Status};
pub use generate::{GenerateParams, GenerateStats, Generation, Sampler, StopReason, Token};
pub use model::{Backend, Budget, ChatMessage, Model, ModelKey, ModelParams};
pub use queue::{Queue, QueueEvent, RequestState};
pub use moelite_sys as sys;
pub use stats::ExpertStats;

/// The linked library's version, "MAJOR.MINOR.PATCH".
pub fn version() -> String {
    unsafe { std::ffi::CStr::from_ptr(sys::moelite_version_string()) }.to_string_lossy().into_owned()
}
