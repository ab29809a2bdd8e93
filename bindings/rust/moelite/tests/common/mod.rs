//! What every test file of the crate starts from: the shipped model and CPU model parameters.
use std::path::PathBuf;

use moelite::{Backend, ModelParams};

/// models/moelite-tiny-qwen3moe-Q8_0.gguf, or MOELITE_TEST_MODEL.
pub fn model_path() -> PathBuf {
    match std::env::var("MOELITE_TEST_MODEL") {
        Ok(p) => PathBuf::from(p),
        Err(_) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../models/moelite-tiny-qwen3moe-Q8_0.gguf"),
    }
}

/// The CPU backend with `threads` compute threads.
pub fn cpu(threads: i32) -> ModelParams {
    ModelParams::new().backend(Backend::Cpu).threads(threads)
}
