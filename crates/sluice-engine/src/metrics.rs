//! The engine's metrics, recorded through the [`metrics`] facade (the server installs the
//! Prometheus exporter). Handles are registered once when the engine starts, so install the
//! recorder before [`crate::Engine::start`]; recording is then a few atomic operations per
//! step and allocates nothing.
//!
//! | name | kind | what |
//! | --- | --- | --- |
//! | `sluice_requests_running` | gauge | sequences holding KV blocks and scheduled every step |
//! | `sluice_requests_waiting` | gauge | sequences queued (new or preempted), plus submissions not yet taken in |
//! | `sluice_kv_cache_blocks_used` | gauge | KV-cache blocks referenced by a sequence |
//! | `sluice_kv_cache_blocks_capacity` | gauge | KV-cache blocks in the pool (a gauge: promtool reserves `_total` for counters) |
//! | `sluice_kv_window_blocks_used` | gauge | blocks of the sliding-window layers' own pools referenced by a sequence, every window group summed (0 without one) |
//! | `sluice_kv_window_blocks_capacity` | gauge | blocks in those pools (0 for a model without one) |
//! | `sluice_recurrent_states_used` | gauge | the hybrids' recurrent states held by a running sequence (0 without recurrent layers) |
//! | `sluice_recurrent_states_capacity` | gauge | recurrent states in the pool (0 for a model without recurrent layers) |
//! | `sluice_prefix_cache_queries_total` | counter | prompt tokens looked up in the prefix cache at (re)admission |
//! | `sluice_prefix_cache_hits_total` | counter | of those, tokens whose K/V came from cached blocks |
//! | `sluice_preemptions_total` | counter | sequences preempted (blocks freed, recomputed later) |
//! | `sluice_prompt_tokens_total` | counter | prompt tokens of requests that produced their first token |
//! | `sluice_generation_tokens_total` | counter | tokens sampled |
//! | `sluice_request_success_total{finish_reason}` | counter | finished sequences, by `stop`, `length`, `abort`, `error` |
//! | `sluice_engine_step_failures_total` | counter | steps whose forward failed |
//! | `sluice_time_to_first_token_seconds` | histogram | arrival to first token, per sequence |
//! | `sluice_inter_token_latency_seconds` | histogram | time between consecutive tokens of a sequence |
//! | `sluice_e2e_request_latency_seconds` | histogram | arrival to finish, per sequence |
//! | `sluice_request_queue_time_seconds` | histogram | arrival to first scheduled, per request |
//! | `sluice_tokens_per_step` | histogram | tokens computed by one forward (prefill and decode) |
//! | `sluice_step_duration_seconds` | histogram | one engine step: schedule, forward, sample, emit |
//! | `sluice_constraint_mask_seconds` | histogram | computing the grammar masks of one step's constrained rows (steps with any) |
//! | `sluice_spec_decode_drafts_total` | counter | times a sequence drafted tokens for a step (`--speculative`) |
//! | `sluice_spec_decode_draft_tokens_total` | counter | tokens drafted |
//! | `sluice_spec_decode_accepted_tokens_total` | counter | drafted tokens kept (the model picked the same) |
//! | `sluice_spec_decode_ineligible_requests_total` | counter | requests run without speculation while it is on (penalties, grammar) |
//! | `sluice_spec_decode_draft_model_failures_total` | counter | draft-model forwards that failed (`--speculative draft:PATH`); their step ran without drafts |
//! | `sluice_draft_kv_cache_blocks_used` | gauge | blocks of the draft model's own KV cache held by sequences (`--speculative draft:PATH`) |
//! | `sluice_kv_events_batches_total` | counter | batches of KV-cache events made (`--kv-events`), one per step that changed the prefix cache |
//! | `sluice_kv_events_dropped_total{reason}` | counter | batches lost: `queue` (the publisher fell behind the engine), `subscriber` (one subscriber's send queue was full, counted per subscriber) |
//! | `sluice_moe_expert_weights_read_ratio` | histogram | a mixture of experts' step: the share of its experts' weights it read (experts at least one row chose, over every layer's experts) |

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Unit,
};

use crate::stop::FinishReason;

pub const REQUESTS_RUNNING: &str = "sluice_requests_running";
pub const REQUESTS_WAITING: &str = "sluice_requests_waiting";
pub const KV_CACHE_BLOCKS_USED: &str = "sluice_kv_cache_blocks_used";
pub const KV_CACHE_BLOCKS_CAPACITY: &str = "sluice_kv_cache_blocks_capacity";
pub const KV_WINDOW_BLOCKS_USED: &str = "sluice_kv_window_blocks_used";
pub const KV_WINDOW_BLOCKS_CAPACITY: &str = "sluice_kv_window_blocks_capacity";
pub const RECURRENT_STATES_USED: &str = "sluice_recurrent_states_used";
pub const RECURRENT_STATES_CAPACITY: &str = "sluice_recurrent_states_capacity";
pub const PREFIX_CACHE_QUERIES: &str = "sluice_prefix_cache_queries_total";
pub const PREFIX_CACHE_HITS: &str = "sluice_prefix_cache_hits_total";
pub const PREEMPTIONS: &str = "sluice_preemptions_total";
pub const PROMPT_TOKENS: &str = "sluice_prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "sluice_generation_tokens_total";
pub const REQUEST_SUCCESS: &str = "sluice_request_success_total";
pub const STEP_FAILURES: &str = "sluice_engine_step_failures_total";
pub const TIME_TO_FIRST_TOKEN: &str = "sluice_time_to_first_token_seconds";
pub const INTER_TOKEN_LATENCY: &str = "sluice_inter_token_latency_seconds";
pub const E2E_REQUEST_LATENCY: &str = "sluice_e2e_request_latency_seconds";
pub const REQUEST_QUEUE_TIME: &str = "sluice_request_queue_time_seconds";
pub const TOKENS_PER_STEP: &str = "sluice_tokens_per_step";
pub const STEP_DURATION: &str = "sluice_step_duration_seconds";
pub const CONSTRAINT_MASK_DURATION: &str = "sluice_constraint_mask_seconds";
pub const SPEC_DRAFTS: &str = "sluice_spec_decode_drafts_total";
pub const SPEC_DRAFT_TOKENS: &str = "sluice_spec_decode_draft_tokens_total";
pub const SPEC_ACCEPTED_TOKENS: &str = "sluice_spec_decode_accepted_tokens_total";
pub const SPEC_INELIGIBLE: &str = "sluice_spec_decode_ineligible_requests_total";
pub const SPEC_DRAFT_MODEL_FAILURES: &str = "sluice_spec_decode_draft_model_failures_total";
pub const DRAFT_KV_CACHE_BLOCKS_USED: &str = "sluice_draft_kv_cache_blocks_used";
pub const KV_EVENT_BATCHES: &str = "sluice_kv_events_batches_total";
pub const KV_EVENTS_DROPPED: &str = "sluice_kv_events_dropped_total";
pub const MOE_EXPERT_SHARE: &str = "sluice_moe_expert_weights_read_ratio";

/// Every name above, for exporters that want to pre-declare buckets or check coverage.
pub const ALL: [&str; 30] = [
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    KV_CACHE_BLOCKS_USED,
    KV_CACHE_BLOCKS_CAPACITY,
    KV_WINDOW_BLOCKS_USED,
    KV_WINDOW_BLOCKS_CAPACITY,
    RECURRENT_STATES_USED,
    RECURRENT_STATES_CAPACITY,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    PREEMPTIONS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    STEP_FAILURES,
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    E2E_REQUEST_LATENCY,
    REQUEST_QUEUE_TIME,
    TOKENS_PER_STEP,
    STEP_DURATION,
    CONSTRAINT_MASK_DURATION,
    SPEC_DRAFTS,
    SPEC_DRAFT_TOKENS,
    SPEC_ACCEPTED_TOKENS,
    SPEC_INELIGIBLE,
    SPEC_DRAFT_MODEL_FAILURES,
    DRAFT_KV_CACHE_BLOCKS_USED,
    KV_EVENT_BATCHES,
    KV_EVENTS_DROPPED,
];

/// Metrics only a mixture of experts records (beside [`ALL`]).
pub const MOE: [&str; 1] = [MOE_EXPERT_SHARE];

/// Registered handles, held by the engine thread.
pub(crate) struct EngineMetrics {
    pub running: Gauge,
    pub waiting: Gauge,
    pub blocks_used: Gauge,
    pub blocks_total: Gauge,
    pub window_blocks_used: Gauge,
    pub window_blocks_total: Gauge,
    pub states_used: Gauge,
    pub states_total: Gauge,
    pub prefix_queries: Counter,
    pub prefix_hits: Counter,
    pub preemptions: Counter,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    /// Indexed like [`FinishReason::ALL`].
    success: [Counter; 4],
    pub step_failures: Counter,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_latency: Histogram,
    pub queue_time: Histogram,
    pub tokens_per_step: Histogram,
    pub step_duration: Histogram,
    pub mask_duration: Histogram,
    pub spec_drafts: Counter,
    pub spec_draft_tokens: Counter,
    pub spec_accepted_tokens: Counter,
    pub spec_ineligible: Counter,
    pub draft_model_failures: Counter,
    pub draft_blocks_used: Gauge,
    pub kv_event_batches: Counter,
    /// `reason="queue"`; the publisher counts `reason="subscriber"`.
    pub kv_events_dropped: Counter,
    pub expert_share: Histogram,
}

impl EngineMetrics {
    /// Every series carries `model` (the served name), so engines of several models in one
    /// process record apart.
    pub fn register(model: &str) -> Self {
        describe_gauge!(REQUESTS_RUNNING, "Sequences running (holding KV blocks).");
        describe_gauge!(REQUESTS_WAITING, "Sequences waiting to be scheduled.");
        describe_gauge!(KV_CACHE_BLOCKS_USED, "KV-cache blocks in use.");
        describe_gauge!(KV_CACHE_BLOCKS_CAPACITY, "KV-cache blocks in the pool.");
        describe_gauge!(
            KV_WINDOW_BLOCKS_USED,
            "Blocks of the sliding-window layers' own pool in use."
        );
        describe_gauge!(
            KV_WINDOW_BLOCKS_CAPACITY,
            "Blocks in the sliding-window layers' own pool (0 without one)."
        );
        describe_gauge!(
            RECURRENT_STATES_USED,
            "Recurrent states (the hybrids' Gated DeltaNet layers) held by running sequences."
        );
        describe_gauge!(
            RECURRENT_STATES_CAPACITY,
            "Recurrent states in the pool (0 without recurrent layers)."
        );
        describe_counter!(
            PREFIX_CACHE_QUERIES,
            Unit::Count,
            "Prompt tokens looked up in the prefix cache."
        );
        describe_counter!(
            PREFIX_CACHE_HITS,
            Unit::Count,
            "Prompt tokens served from the prefix cache."
        );
        describe_counter!(
            PREEMPTIONS,
            Unit::Count,
            "Sequences preempted for KV blocks."
        );
        describe_counter!(PROMPT_TOKENS, Unit::Count, "Prompt tokens processed.");
        describe_counter!(GENERATION_TOKENS, Unit::Count, "Tokens generated.");
        describe_counter!(
            REQUEST_SUCCESS,
            Unit::Count,
            "Finished sequences by finish reason."
        );
        describe_counter!(
            STEP_FAILURES,
            Unit::Count,
            "Engine steps whose forward failed."
        );
        describe_histogram!(TIME_TO_FIRST_TOKEN, Unit::Seconds, "Time to first token.");
        describe_histogram!(INTER_TOKEN_LATENCY, Unit::Seconds, "Time between tokens.");
        describe_histogram!(E2E_REQUEST_LATENCY, Unit::Seconds, "Arrival to finish.");
        describe_histogram!(
            REQUEST_QUEUE_TIME,
            Unit::Seconds,
            "Arrival to first scheduled."
        );
        describe_histogram!(
            TOKENS_PER_STEP,
            Unit::Count,
            "Tokens computed per engine step."
        );
        describe_histogram!(STEP_DURATION, Unit::Seconds, "Duration of one engine step.");
        describe_histogram!(
            CONSTRAINT_MASK_DURATION,
            Unit::Seconds,
            "Time computing one step's grammar masks."
        );
        describe_counter!(
            SPEC_DRAFTS,
            Unit::Count,
            "Times a sequence drafted tokens for a step."
        );
        describe_counter!(SPEC_DRAFT_TOKENS, Unit::Count, "Tokens drafted.");
        describe_counter!(SPEC_ACCEPTED_TOKENS, Unit::Count, "Drafted tokens kept.");
        describe_counter!(
            SPEC_INELIGIBLE,
            Unit::Count,
            "Requests run without speculation while it is on."
        );
        describe_counter!(
            SPEC_DRAFT_MODEL_FAILURES,
            Unit::Count,
            "Draft-model forwards that failed (their step ran without drafts)."
        );
        describe_gauge!(
            DRAFT_KV_CACHE_BLOCKS_USED,
            "Blocks of the draft model's KV cache in use."
        );
        describe_counter!(
            KV_EVENT_BATCHES,
            Unit::Count,
            "Batches of KV-cache events made."
        );
        describe_counter!(
            KV_EVENTS_DROPPED,
            Unit::Count,
            "Batches of KV-cache events lost, by where."
        );
        describe_histogram!(
            MOE_EXPERT_SHARE,
            "A mixture-of-experts step's share of the experts' weights it read."
        );
        Self {
            running: gauge!(REQUESTS_RUNNING, "model" => model.to_string()),
            waiting: gauge!(REQUESTS_WAITING, "model" => model.to_string()),
            blocks_used: gauge!(KV_CACHE_BLOCKS_USED, "model" => model.to_string()),
            blocks_total: gauge!(KV_CACHE_BLOCKS_CAPACITY, "model" => model.to_string()),
            window_blocks_used: gauge!(KV_WINDOW_BLOCKS_USED, "model" => model.to_string()),
            window_blocks_total: gauge!(KV_WINDOW_BLOCKS_CAPACITY, "model" => model.to_string()),
            states_used: gauge!(RECURRENT_STATES_USED, "model" => model.to_string()),
            states_total: gauge!(RECURRENT_STATES_CAPACITY, "model" => model.to_string()),
            prefix_queries: counter!(PREFIX_CACHE_QUERIES, "model" => model.to_string()),
            prefix_hits: counter!(PREFIX_CACHE_HITS, "model" => model.to_string()),
            preemptions: counter!(PREEMPTIONS, "model" => model.to_string()),
            prompt_tokens: counter!(PROMPT_TOKENS, "model" => model.to_string()),
            generation_tokens: counter!(GENERATION_TOKENS, "model" => model.to_string()),
            success: FinishReason::ALL
                .map(|r| counter!(REQUEST_SUCCESS, "model" => model.to_string(), "finish_reason" => r.as_str())),
            step_failures: counter!(STEP_FAILURES, "model" => model.to_string()),
            time_to_first_token: histogram!(TIME_TO_FIRST_TOKEN, "model" => model.to_string()),
            inter_token_latency: histogram!(INTER_TOKEN_LATENCY, "model" => model.to_string()),
            e2e_latency: histogram!(E2E_REQUEST_LATENCY, "model" => model.to_string()),
            queue_time: histogram!(REQUEST_QUEUE_TIME, "model" => model.to_string()),
            tokens_per_step: histogram!(TOKENS_PER_STEP, "model" => model.to_string()),
            step_duration: histogram!(STEP_DURATION, "model" => model.to_string()),
            mask_duration: histogram!(CONSTRAINT_MASK_DURATION, "model" => model.to_string()),
            spec_drafts: counter!(SPEC_DRAFTS, "model" => model.to_string()),
            spec_draft_tokens: counter!(SPEC_DRAFT_TOKENS, "model" => model.to_string()),
            spec_accepted_tokens: counter!(SPEC_ACCEPTED_TOKENS, "model" => model.to_string()),
            spec_ineligible: counter!(SPEC_INELIGIBLE, "model" => model.to_string()),
            draft_model_failures: counter!(SPEC_DRAFT_MODEL_FAILURES, "model" => model.to_string()),
            draft_blocks_used: gauge!(DRAFT_KV_CACHE_BLOCKS_USED, "model" => model.to_string()),
            kv_event_batches: counter!(KV_EVENT_BATCHES, "model" => model.to_string()),
            kv_events_dropped: counter!(KV_EVENTS_DROPPED, "model" => model.to_string(), "reason" => "queue"),
            expert_share: histogram!(MOE_EXPERT_SHARE, "model" => model.to_string()),
        }
    }

    pub fn finished(&self, reason: FinishReason) -> &Counter {
        let i = FinishReason::ALL
            .iter()
            .position(|&r| r == reason)
            .unwrap_or(0);
        &self.success[i]
    }
}
