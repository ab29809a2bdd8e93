//! The quality meter and governor through the safe crate (`ContextParams::quality_sample`,
//! `quality_target`, `quality_bounds`, `Context::quality_stats`) on the shipped model
//! (models/moelite-tiny-qwen3moe-Q8_0.gguf, or MOELITE_TEST_MODEL). The meter's KL is checked
//! against the KL computed here from the logits of an exactly routed context that loads the gated
//! context's session before each step, so both see the same (gated) history.

use moelite::{Context, ContextParams, Model, Status};

mod common;
use common::{cpu, model_path};

const TEXT: &str = "The module provides functions for working with lists, dictionaries and sets. \
                    Each function returns a new object and leaves its arguments unchanged. ";

/// KL(p || q) of two logit vectors, in f64 as the meter computes it.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |x: &[f32]| -> Vec<f64> {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
        x.iter().map(|&v| v as f64 - max - lse).collect()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

#[test]
fn the_meter_reports_the_kl_of_each_gated_token_against_exact_routing() {
    let gated_model = Model::load(model_path(), &cpu(1).gating("score", 0.25)).unwrap(); // no profile needed
    let exact_model = Model::load(model_path(), &cpu(1)).unwrap();
    let tokens = gated_model.tokenize(TEXT, false, false).unwrap();
    let tokens = &tokens[..16];
    let mut gated = Context::new(&gated_model, &ContextParams::new().n_ctx(64).quality_sample(1.0)).unwrap();
    let mut exact = Context::new(&exact_model, &ContextParams::new().n_ctx(64)).unwrap();
    let dir = std::env::temp_dir().join(format!("moelite-rust-quality-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let session = dir.join("gated.session");
    let mut want = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if i > 0 {
            // The exact context continues from the gated one's cache, as the meter's exact pass does.
            gated.save(&session).unwrap();
            exact.load(&session).unwrap();
        }
        gated.eval(&[t], false).unwrap();
        exact.eval(&[t], false).unwrap();
        want.push(kl(exact.logits(-1).unwrap(), gated.logits(-1).unwrap()));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let q = gated.quality_stats().unwrap();
    assert_eq!((q.metered_tokens, q.gated_tokens, q.meter_evaluations), (16, 16, 16));
    let mean = want.iter().sum::<f64>() / want.len() as f64;
    assert!(mean > 0.0 && q.kl_mean > 0.0, "gating at 0.25 changed nothing: {mean} {}", q.kl_mean);
    assert!((q.kl_mean - mean).abs() <= 1e-6 * mean + 1e-12, "meter {} here {mean}", q.kl_mean);
    assert!(q.kl_stderr > 0.0 && (0.0..=1.0).contains(&q.top1_agreement));
    assert_eq!(q.predicted_loss, 0.0); // score gating has no sensitivities
    assert_eq!(q.target_kl, 0.0); // no governor
    assert!((q.threshold - 0.25).abs() < 1e-7, "the model's threshold: {}", q.threshold);
    // Exact routing costs nothing and meters nothing.
    assert_eq!(exact.quality_stats().unwrap(), moelite::QualityStats::default());
}

#[test]
fn the_governor_needs_a_valid_target_and_holds_it() {
    let model = Model::load(model_path(), &cpu(1).gating("sensitivity", 0.0)).unwrap(); // no profile
    // Sensitivity gating without a profile has nothing to scale its threshold by, unless the
    // governor learns it.
    let e = Context::new(&model, &ContextParams::new()).err().unwrap();
    assert_eq!(e.status, Status::BAD_PROFILE, "{e}");
    for bad in ["0%", "200%", "kl:-1", "one percent"] {
        let e = Context::new(&model, &ContextParams::new().quality_target(bad)).err().unwrap();
        assert_eq!(e.status, Status::INVALID_ARGUMENT, "{bad}: {e}");
    }
    // NUL is refused here, before the library would read the target as "1".
    let e = Context::new(&model, &ContextParams::new().quality_target("1\0%")).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(e.message.contains("NUL"), "{}", e.message);
    let e = Context::new(&model, &ContextParams::new().quality_target("1%").quality_bounds(1.0, 0.5)).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    let e = Context::new(&model, &ContextParams::new().quality_target("1%").quality_sample(1.5)).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);

    let params = ContextParams::new().n_ctx(256).quality_target("1%").quality_sample(0.5).quality_bounds(0.0, 1.0);
    let mut ctx = Context::new(&model, &params).unwrap();
    let tokens = model.tokenize(&TEXT.repeat(4), false, false).unwrap();
    for &t in &tokens[..100] {
        ctx.eval(&[t], false).unwrap();
    }
    let q = ctx.quality_stats().unwrap();
    assert!((q.target_kl - 1.01f64.ln()).abs() <= 1e-12, "target_kl {}", q.target_kl);
    assert_eq!(q.gated_tokens, 100);
    assert!(q.metered_tokens > 20 && q.metered_tokens < 100, "metered {}", q.metered_tokens);
    assert!(q.threshold > 0.0 && q.threshold <= 1.0, "threshold {}", q.threshold);
    assert!(q.predicted_loss > 0.0 && q.kl_per_predicted > 0.0, "{q:?}");

    // A target needs sensitivity (or cache-aware) gating: score gating has no loss to steer by.
    let score = Model::load(model_path(), &cpu(1).gating("score", 0.1)).unwrap();
    let e = Context::new(&score, &ContextParams::new().quality_target("1%")).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
}
