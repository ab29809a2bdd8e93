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
//!
//! What the C API checks at run time (a second thread in a context's call gets
//! `Status::BUSY`) the types check here at compile time. A `Context` is not `Sync`, so two threads
//! never call into one context at once:
//!
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<moelite::Context>();
//! ```
//!
//! A `Generation` borrows its context mutably, so one generation per context at a time: a second
//! one, or any other call on the context, does not compile while the first lives:
//!
//! ```compile_fail
//! # use moelite::{Context, ContextParams, GenerateParams, Model};
//! # fn f(model: &Model) -> moelite::Result<()> {
//! let mut ctx = Context::new(model, &ContextParams::new())?;
//! let first = ctx.generate(&[1], &GenerateParams::new())?;
//! let second = ctx.generate(&[1], &GenerateParams::new())?; // error[E0499]
//! drop((first, second));
//! # Ok(())
//! # }
//! ```
//!
//! and a model is freed only once no call borrows it (a context keeps the library's model alive
//! by itself, so it may outlive the `Model`). Slices longer than the C API's `int32_t` counts and
//! strings with NUL where it takes NUL-terminated text are refused with `Status::INVALID_ARGUMENT`.
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
pub use stats::{ExpertStats, QualityStats};

/// The linked library's version, "MAJOR.MINOR.PATCH".
pub fn version() -> String {
    unsafe { std::ffi::CStr::from_ptr(sys::moelite_version_string()) }.to_string_lossy().into_owned()
}
