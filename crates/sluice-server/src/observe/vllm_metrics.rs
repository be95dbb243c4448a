//! vLLM's metric names on `/metrics`, beside sluice's own `sluice_*` ones, for the routers that
//! pick a server by reading them: the Gateway API Inference Extension's endpoint picker and
//! llm-d (waiting, running, KV-cache usage, the cache's shape) and vLLM's production-stack router
//! (running, waiting, KV-cache usage, prefix-cache hits and queries). `docs/routers.md` says
//! which router reads which.
//!
//! | name | kind | value |
//! | --- | --- | --- |
//! | `vllm:num_requests_running` | gauge | sequences running (`sluice_requests_running`) |
//! | `vllm:num_requests_waiting` | gauge | sequences waiting, submissions not yet taken in included (`sluice_requests_waiting`) |
//! | `vllm:kv_cache_usage_perc` | gauge | fraction of KV-cache blocks in use, 0 to 1 |
//! | `vllm:gpu_cache_usage_perc` | gauge | the same (vLLM's older name, still read) |
//! | `vllm:prefix_cache_queries_total` | counter | prompt tokens looked up in the prefix cache (`sluice_prefix_cache_queries_total`) |
//! | `vllm:prefix_cache_hits_total` | counter | of those, tokens found there (`sluice_prefix_cache_hits_total`) |
//! | `vllm:gpu_prefix_cache_queries_total` | counter | the same as `vllm:prefix_cache_queries_total` (older name) |
//! | `vllm:gpu_prefix_cache_hits_total` | counter | the same as `vllm:prefix_cache_hits_total` (older name) |
//! | `vllm:cache_config_info` | gauge | 1, its labels describing the KV cache |
//! | `vllm:spec_decode_num_drafts_total` | counter | times a sequence drafted tokens for a step (`--speculative`) |
//! | `vllm:spec_decode_num_draft_tokens_total` | counter | tokens drafted |
//! | `vllm:spec_decode_num_accepted_tokens_total` | counter | drafted tokens kept |
//!
//! Every series is labelled `model_name` (the served model's name) and `engine="0"`, as vLLM
//! labels each engine of its process. `vllm:cache_config_info` carries vLLM's cache-config
//! labels that mean something here (`block_size`, `num_gpu_blocks`: the blocks of the KV cache,
//! in host memory on a CPU; `enable_prefix_caching`, always `True`), with vLLM's spelling of the
//! values (Python's `str`), and `model_name` as well, which vLLM's lacks.
//! `vllm:lora_requests_info` (a gauge whose value is the Unix time it was last set, vLLM's
//! convention) is exported where LoRA adapters are served: its labels `running_lora_adapters`
//! and `waiting_lora_adapters` (the adapters running and waiting sequences use, names
//! comma-separated) and `max_lora` (`--max-loras`) are what the inference extension's
//! LoRA-affinity scorer reads. Each scrape sets the series of the current labels.
//!
//! Nothing here is measured anew. The engine publishes its counts once per step into the
//! counters its handle reads ([`EngineStats`], the numbers behind the `sluice_*` metrics); each
//! scrape copies them into these series just before rendering ([`VllmMetrics::update`]), so the
//! engine's step pays nothing for them and the two families cannot disagree on a quantity.

use metrics::{counter, describe_counter, describe_gauge, gauge, Counter, Gauge, Unit};
use sluice_engine::{EngineHandle, EngineStats, LoraUsage};

pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
pub const GPU_CACHE_USAGE_PERC: &str = "vllm:gpu_cache_usage_perc";
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries_total";
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits_total";
pub const GPU_PREFIX_CACHE_QUERIES: &str = "vllm:gpu_prefix_cache_queries_total";
pub const GPU_PREFIX_CACHE_HITS: &str = "vllm:gpu_prefix_cache_hits_total";
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
pub const SPEC_DECODE_NUM_DRAFTS: &str = "vllm:spec_decode_num_drafts_total";
pub const SPEC_DECODE_NUM_DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
pub const SPEC_DECODE_NUM_ACCEPTED_TOKENS: &str = "vllm:spec_decode_num_accepted_tokens_total";
pub const LORA_REQUESTS_INFO: &str = "vllm:lora_requests_info";

/// Every name above.
pub const ALL: [&str; 12] = [
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    KV_CACHE_USAGE_PERC,
    GPU_CACHE_USAGE_PERC,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    GPU_PREFIX_CACHE_QUERIES,
    GPU_PREFIX_CACHE_HITS,
    CACHE_CONFIG_INFO,
    SPEC_DECODE_NUM_DRAFTS,
    SPEC_DECODE_NUM_DRAFT_TOKENS,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS,
];

/// The value of vLLM's `engine` label: one engine per sluice process.
const ENGINE: &str = "0";

/// The KV cache's shape, as `vllm:cache_config_info` states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
}

impl CacheShape {
    /// The running engine's cache. The engine allocates whole blocks and states its capacity
    /// in tokens (`kv_cache_tokens = blocks * block_size`), so the block size is the quotient.
    pub fn of(engine: &EngineHandle) -> Self {
        let num_blocks = engine.stats().kv_blocks_total;
        let block_size = engine
            .limits()
            .kv_cache_tokens
            .checked_div(num_blocks)
            .unwrap_or(0);
        Self {
            block_size,
            num_blocks,
        }
    }
}

/// The registered series of one served model.
pub struct VllmMetrics {
    running: Gauge,
    waiting: Gauge,
    /// `vllm:kv_cache_usage_perc` and `vllm:gpu_cache_usage_perc`.
    kv_usage: [Gauge; 2],
    /// The V1 name, then the older `gpu_` one.
    prefix_queries: [Counter; 2],
    prefix_hits: [Counter; 2],
    /// Drafts, draft tokens, accepted tokens.
    spec_decode: [Counter; 3],
}

impl VllmMetrics {
    /// Registers every series with the installed recorder (install it first:
    /// [`crate::observe::metrics::install`]) and sets `vllm:cache_config_info`, which never changes.
    pub fn register(model_name: &str, cache: CacheShape) -> Self {
        describe_gauge!(
            NUM_REQUESTS_RUNNING,
            "Number of requests in model execution batches."
        );
        describe_gauge!(
            NUM_REQUESTS_WAITING,
            "Number of requests waiting to be processed."
        );
        describe_gauge!(
            KV_CACHE_USAGE_PERC,
            "KV-cache usage. 1 means 100 percent usage."
        );
        describe_gauge!(
            GPU_CACHE_USAGE_PERC,
            "KV-cache usage. 1 means 100 percent usage. The older name of vllm:kv_cache_usage_perc."
        );
        describe_counter!(
            PREFIX_CACHE_QUERIES,
            Unit::Count,
            "Prefix cache queries, in terms of number of queried tokens."
        );
        describe_counter!(
            PREFIX_CACHE_HITS,
            Unit::Count,
            "Prefix cache hits, in terms of number of cached tokens."
        );
        describe_counter!(
            GPU_PREFIX_CACHE_QUERIES,
            Unit::Count,
            "Prefix cache queries, in tokens. The older name of vllm:prefix_cache_queries_total."
        );
        describe_counter!(
            GPU_PREFIX_CACHE_HITS,
            Unit::Count,
            "Prefix cache hits, in tokens. The older name of vllm:prefix_cache_hits_total."
        );
        describe_counter!(
            SPEC_DECODE_NUM_DRAFTS,
            Unit::Count,
            "Number of spec decoding drafts."
        );
        describe_counter!(
            SPEC_DECODE_NUM_DRAFT_TOKENS,
            Unit::Count,
            "Number of draft tokens."
        );
        describe_counter!(
            SPEC_DECODE_NUM_ACCEPTED_TOKENS,
            Unit::Count,
            "Number of accepted tokens."
        );
        describe_gauge!(
            LORA_REQUESTS_INFO,
            "Running stats on LoRA requests (its value the Unix time it was set)."
        );
        describe_gauge!(
            CACHE_CONFIG_INFO,
            "Information of the KV cache's configuration (always 1)."
        );
        let labels = || {
            [
                ("model_name", model_name.to_string()),
                ("engine", ENGINE.to_string()),
            ]
        };
        gauge!(
            CACHE_CONFIG_INFO,
            "model_name" => model_name.to_string(),
            "engine" => ENGINE,
            "block_size" => cache.block_size.to_string(),
            "num_gpu_blocks" => cache.num_blocks.to_string(),
            "enable_prefix_caching" => "True",
        )
        .set(1.0);
        Self {
            running: gauge!(NUM_REQUESTS_RUNNING, &labels()),
            waiting: gauge!(NUM_REQUESTS_WAITING, &labels()),
            kv_usage: [
                gauge!(KV_CACHE_USAGE_PERC, &labels()),
                gauge!(GPU_CACHE_USAGE_PERC, &labels()),
            ],
            prefix_queries: [
                counter!(PREFIX_CACHE_QUERIES, &labels()),
                counter!(GPU_PREFIX_CACHE_QUERIES, &labels()),
            ],
            prefix_hits: [
                counter!(PREFIX_CACHE_HITS, &labels()),
                counter!(GPU_PREFIX_CACHE_HITS, &labels()),
            ],
            spec_decode: [
                counter!(SPEC_DECODE_NUM_DRAFTS, &labels()),
                counter!(SPEC_DECODE_NUM_DRAFT_TOKENS, &labels()),
                counter!(SPEC_DECODE_NUM_ACCEPTED_TOKENS, &labels()),
            ],
        }
    }

    /// Sets `vllm:lora_requests_info` for the adapters in use now (at each scrape, where LoRA
    /// adapters are served): its value the time, its labels the adapters.
    pub fn update_lora(usage: &LoraUsage, max_loras: usize) {
        let names =
            |v: &[std::sync::Arc<str>]| v.iter().map(|n| &**n).collect::<Vec<&str>>().join(",");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        gauge!(
            LORA_REQUESTS_INFO,
            "running_lora_adapters" => names(&usage.running),
            "waiting_lora_adapters" => names(&usage.waiting),
            "max_lora" => max_loras.to_string(),
        )
        .set(now);
    }

    /// Copies the engine's published counts into the series (at each scrape). The prefix
    /// counters are the engine's running totals: a counter takes the larger of its value and
    /// the total, so it never goes back.
    pub fn update(&self, stats: &EngineStats) {
        self.running.set(stats.running as f64);
        self.waiting.set(stats.waiting as f64);
        let usage = kv_cache_usage(stats);
        for gauge in &self.kv_usage {
            gauge.set(usage);
        }
        for counter in &self.prefix_queries {
            counter.absolute(stats.prefix_cache.queries);
        }
        for counter in &self.prefix_hits {
            counter.absolute(stats.prefix_cache.hits);
        }
        let [drafts, draft_tokens, accepted] = &self.spec_decode;
        drafts.absolute(stats.spec_drafts);
        draft_tokens.absolute(stats.spec_draft_tokens);
        accepted.absolute(stats.spec_accepted_tokens);
    }
}

/// The fraction of the KV cache's blocks referenced by a sequence (0 for an empty pool).
pub fn kv_cache_usage(stats: &EngineStats) -> f64 {
    if stats.kv_blocks_total == 0 {
        return 0.0;
    }
    stats.kv_blocks_used as f64 / stats.kv_blocks_total as f64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metrics_exporter_prometheus::PrometheusBuilder;
    use sluice_engine::PrefixCacheStats;

    use super::*;

    fn stats(running: usize, waiting: usize, used: usize, queries: u64, hits: u64) -> EngineStats {
        EngineStats {
            running,
            waiting,
            kv_blocks_used: used,
            kv_blocks_total: 64,
            preemptions: 0,
            prefix_cache: PrefixCacheStats { queries, hits },
            steps: 0,
            failed_steps: 0,
            step_time: Duration::ZERO,
            forward_time: Duration::ZERO,
            sample_time: Duration::ZERO,
            spec_drafts: 0,
            spec_draft_tokens: 0,
            spec_accepted_tokens: 0,
            draft_time: Duration::ZERO,
            draft_kv_blocks_used: 0,
            draft_kv_blocks_total: 0,
        }
    }

    /// The sample lines and the `# TYPE` line of `name` in `text`.
    fn family<'a>(text: &'a str, name: &str) -> (Vec<&'a str>, Option<&'a str>) {
        let samples = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect();
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")));
        (samples, kind)
    }

    /// What the Prometheus exporter renders: vLLM's exact names (colons kept), types and
    /// labels, and the engine's numbers.
    #[test]
    fn renders_vllms_names_types_labels_and_the_engines_numbers() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let shape = CacheShape {
            block_size: 16,
            num_blocks: 64,
        };
        let vllm = metrics::with_local_recorder(&recorder, || VllmMetrics::register("m-1", shape));
        vllm.update(&stats(3, 5, 16, 200, 120));
        let text = handle.render();

        let labels = r#"{model_name="m-1",engine="0"}"#;
        let expected = [
            (NUM_REQUESTS_RUNNING, "gauge", "3"),
            (NUM_REQUESTS_WAITING, "gauge", "5"),
            (KV_CACHE_USAGE_PERC, "gauge", "0.25"),
            (GPU_CACHE_USAGE_PERC, "gauge", "0.25"),
            (PREFIX_CACHE_QUERIES, "counter", "200"),
            (GPU_PREFIX_CACHE_QUERIES, "counter", "200"),
            (PREFIX_CACHE_HITS, "counter", "120"),
            (GPU_PREFIX_CACHE_HITS, "counter", "120"),
        ];
        for (name, kind, value) in expected {
            let (samples, rendered_kind) = family(&text, name);
            assert_eq!(rendered_kind, Some(kind), "{name}:\n{text}");
            assert_eq!(samples, [format!("{name}{labels} {value}")], "{text}");
        }
        let (info, kind) = family(&text, CACHE_CONFIG_INFO);
        assert_eq!(kind, Some("gauge"));
        assert_eq!(
            info,
            [
                r#"vllm:cache_config_info{model_name="m-1",engine="0",block_size="16",num_gpu_blocks="64",enable_prefix_caching="True"} 1"#
            ],
            "{text}"
        );
        // One family per name, nothing renamed.
        for name in ALL {
            assert_eq!(
                text.matches(&format!("# TYPE {name} ")).count(),
                1,
                "{name}"
            );
        }
    }

    /// Gauges follow the engine both ways; counters only go up, whatever a scrape reads.
    #[test]
    fn gauges_follow_the_engine_and_counters_never_go_back() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let shape = CacheShape {
            block_size: 16,
            num_blocks: 64,
        };
        let vllm = metrics::with_local_recorder(&recorder, || VllmMetrics::register("m", shape));
        vllm.update(&stats(4, 9, 64, 50, 10));
        vllm.update(&stats(0, 0, 0, 40, 5));
        let text = handle.render();
        let value = |name: &str| {
            let (samples, _) = family(&text, name);
            samples[0].rsplit(' ').next().unwrap().to_string()
        };
        assert_eq!(value(NUM_REQUESTS_RUNNING), "0");
        assert_eq!(value(NUM_REQUESTS_WAITING), "0");
        assert_eq!(value(KV_CACHE_USAGE_PERC), "0");
        assert_eq!(value(PREFIX_CACHE_QUERIES), "50");
        assert_eq!(value(GPU_PREFIX_CACHE_HITS), "10");
    }

    #[test]
    fn usage_is_a_fraction_of_the_pool() {
        assert_eq!(kv_cache_usage(&stats(0, 0, 0, 0, 0)), 0.0);
        assert_eq!(kv_cache_usage(&stats(0, 0, 64, 0, 0)), 1.0);
        let empty_pool = EngineStats {
            kv_blocks_total: 0,
            ..stats(0, 0, 0, 0, 0)
        };
        assert_eq!(kv_cache_usage(&empty_pool), 0.0);
    }
}
