//! The expert store's counters (`moelite_expert_stats`), as plain Rust data.
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
        }
    }
}
