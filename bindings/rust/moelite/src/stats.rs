//! The expert store's counters (`moelite_expert_stats`) and what lossy gating cost
//! (`moelite_quality_stats`), as plain Rust data.
use moelite_sys as sys;

/// Counters of the expert store (see `moelite_expert_stats` in the header).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExpertStats {
    /// Experts asked for by routing.
    pub activations: u64,
    pub hits: u64,
    /// Experts loaded on demand.
    pub misses: u64,
    pub prefetches_issued: u64,
    pub prefetches_used: u64,
    pub prefetches_wasted: u64,
    /// Bytes read from storage.
    pub bytes_read: u64,
    /// Time computation waited for loads.
    pub wait_seconds: f64,
    pub predicted: u64,
    pub predictions: u64,
    pub ready_when_needed: u64,
    pub routed_tokens: u64,
    pub routed_experts: u64,
    pub read_busy_seconds: f64,
    /// Read requests that landed (an expert is 3 from the model file, 1 from a packed file).
    pub reads: u64,
}

impl ExpertStats {
    /// Share of activations whose expert was in memory (1.0 with no activations).
    pub fn hit_rate(&self) -> f64 {
        if self.activations == 0 {
            1.0
        } else {
            self.hits as f64 / self.activations as f64
        }
    }

    pub(crate) fn raw_zeroed() -> sys::moelite_expert_stats {
        sys::moelite_expert_stats {
            struct_size: std::mem::size_of::<sys::moelite_expert_stats>(),
            activations: 0,
            hits: 0,
            misses: 0,
            prefetches_issued: 0,
            prefetches_used: 0,
            prefetches_wasted: 0,
            bytes_read: 0,
            wait_seconds: 0.0,
            predicted: 0,
            predictions: 0,
            ready_when_needed: 0,
            routed_tokens: 0,
            routed_experts: 0,
            read_busy_seconds: 0.0,
            reads: 0,
        }
    }
}

impl From<sys::moelite_expert_stats> for ExpertStats {
    fn from(s: sys::moelite_expert_stats) -> Self {
        ExpertStats {
            activations: s.activations,
            hits: s.hits,
            misses: s.misses,
            prefetches_issued: s.prefetches_issued,
            prefetches_used: s.prefetches_used,
            prefetches_wasted: s.prefetches_wasted,
            bytes_read: s.bytes_read,
            wait_seconds: s.wait_seconds,
            predicted: s.predicted,
            predictions: s.predictions,
            ready_when_needed: s.ready_when_needed,
            routed_tokens: s.routed_tokens,
            routed_experts: s.routed_experts,
            read_busy_seconds: s.read_busy_seconds,
            reads: s.reads,
        }
    }
}

/// What lossy gating cost a context (see `moelite_quality_stats` in the header): measured by the
/// quality meter on sampled tokens against exact routing, predicted by the sensitivity model on
/// every token; the governor's threshold and target. All zero with exact gating.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QualityStats {
    /// Tokens evaluated with lossy gating.
    pub gated_tokens: u64,
    /// The sensitivity model's loss per token (0 with "score" gating, which has no sensitivities).
    pub predicted_loss: f64,
    /// Next-token distributions compared with exact routing.
    pub metered_tokens: u64,
    /// Their mean KL(exact || gated), nats per token.
    pub kl_mean: f64,
    pub kl_stderr: f64,
    /// Share of metered tokens whose most likely token is the same.
    pub top1_agreement: f64,
    pub top1_stderr: f64,
    /// The predicted loss per token of the metered tokens alone.
    pub predicted_loss_metered: f64,
    /// Exact passes run (one per metered step) and their time.
    pub meter_evaluations: u64,
    pub meter_seconds: f64,
    /// The gating threshold in use now (the governor's, or the model's).
    pub threshold: f64,
    /// The governor's target in nats per token (0: no governor).
    pub target_kl: f64,
    /// The governor's estimate of measured KL per unit of predicted loss.
    pub kl_per_predicted: f64,
}

impl QualityStats {
    pub(crate) fn raw_zeroed() -> sys::moelite_quality_stats {
        sys::moelite_quality_stats {
            struct_size: std::mem::size_of::<sys::moelite_quality_stats>(),
            gated_tokens: 0,
            predicted_loss: 0.0,
            metered_tokens: 0,
            kl_mean: 0.0,
            kl_stderr: 0.0,
            top1_agreement: 0.0,
            top1_stderr: 0.0,
            predicted_loss_metered: 0.0,
            meter_evaluations: 0,
            meter_seconds: 0.0,
            threshold: 0.0,
            target_kl: 0.0,
            kl_per_predicted: 0.0,
        }
    }
}

impl From<sys::moelite_quality_stats> for QualityStats {
    fn from(s: sys::moelite_quality_stats) -> Self {
        QualityStats {
            gated_tokens: s.gated_tokens,
            predicted_loss: s.predicted_loss,
            metered_tokens: s.metered_tokens,
            kl_mean: s.kl_mean,
            kl_stderr: s.kl_stderr,
            top1_agreement: s.top1_agreement,
            top1_stderr: s.top1_stderr,
            predicted_loss_metered: s.predicted_loss_metered,
            meter_evaluations: s.meter_evaluations,
            meter_seconds: s.meter_seconds,
            threshold: s.threshold,
            target_kl: s.target_kl,
            kl_per_predicted: s.kl_per_predicted,
        }
    }
}
