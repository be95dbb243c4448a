//! The engine's metrics, read back through a recording `metrics` recorder. Its own test
//! binary: the recorder is process-global and must be installed before the engine starts.

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use sluice_engine::metrics as names;
use sluice_engine::testing::{tiny_tokenizer, MockModel, TINY_VOCAB};
use sluice_engine::{Engine, EngineConfig, Event, Request, StopParams};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn every_metric_is_recorded_with_the_right_counts() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let model = MockModel::new(TINY_VOCAB, 512, 64, 16);
    let control = model.control();
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), EngineConfig::default()).unwrap();
    let h = engine.handle();
    let request = |seed: u32, max_tokens| Request {
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        ..Request::new((0..40).map(|i| (i * 7 + seed) % 256).collect(), max_tokens)
    };
    // Two requests to completion (the second shares the first's prompt blocks), one aborted,
    // one failed.
    let a = h
        .submit(h.validate(request(1, 5)).unwrap())
        .unwrap()
        .collect_blocking();
    let b = h
        .submit(h.validate(request(1, 3)).unwrap())
        .unwrap()
        .collect_blocking();
    assert_eq!(a.len() + b.len(), 5 + 3 + 2);
    control.hold();
    let mut aborted = h.submit(h.validate(request(2, 100)).unwrap()).unwrap();
    assert!(control.wait_until_held(1, WAIT));
    control.release(1);
    assert!(control.wait_until_held(2, WAIT));
    h.abort(aborted.id());
    control.open();
    assert!(matches!(aborted.blocking_recv(), Some(Event::Token(_))));
    while aborted.blocking_recv().is_some() {}
    control.fail_next(1);
    h.submit(h.validate(request(3, 5)).unwrap())
        .unwrap()
        .collect_blocking();
    // Joins the engine thread: everything it will ever publish is published.
    drop(engine);
    let stats = h.stats();

    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut gauges: HashMap<String, f64> = HashMap::new();
    let mut histograms: HashMap<String, usize> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, k) = key.into_parts();
        let mut name = k.name().to_string();
        // Every series carries the engine's `model` label (empty here: the config names none);
        // the keys below leave it out.
        assert!(
            k.labels()
                .any(|l| l.key() == "model" && l.value().is_empty()),
            "{name} has no model label"
        );
        for label in k.labels().filter(|l| l.key() != "model") {
            name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
        }
        match value {
            DebugValue::Counter(v) => {
                counters.insert(name, v);
            }
            DebugValue::Gauge(v) => {
                gauges.insert(name, v.into_inner());
            }
            DebugValue::Histogram(v) => {
                histograms.insert(name, v.len());
            }
        }
    }
    let counter = |n: &str| {
        counters
            .get(n)
            .copied()
            .unwrap_or_else(|| panic!("no counter {n}"))
    };
    let generated = counter(names::GENERATION_TOKENS);
    assert_eq!(generated, 5 + 3 + 2, "two tokens came before the abort");
    assert_eq!(
        counter(names::PROMPT_TOKENS),
        3 * 40,
        "three requests produced a token"
    );
    assert_eq!(
        counter("sluice_request_success_total{finish_reason=length}"),
        2
    );
    assert_eq!(
        counter("sluice_request_success_total{finish_reason=abort}"),
        1
    );
    assert_eq!(
        counter("sluice_request_success_total{finish_reason=error}"),
        1
    );
    assert_eq!(
        counter("sluice_request_success_total{finish_reason=stop}"),
        0
    );
    assert_eq!(counter(names::STEP_FAILURES), 1);
    assert_eq!(counter(names::PREFIX_CACHE_HITS), stats.prefix_cache.hits);
    assert!(counter(names::PREFIX_CACHE_HITS) >= 32);
    assert_eq!(
        counter(names::PREFIX_CACHE_QUERIES),
        stats.prefix_cache.queries
    );
    assert_eq!(counter(names::PREEMPTIONS), 0);
    assert_eq!(gauges[names::KV_CACHE_BLOCKS_CAPACITY], 64.0);
    assert_eq!(gauges[names::KV_CACHE_BLOCKS_USED], 0.0);
    assert_eq!(gauges[names::REQUESTS_RUNNING], 0.0);
    assert_eq!(gauges[names::REQUESTS_WAITING], 0.0);
    assert_eq!(histograms[names::TIME_TO_FIRST_TOKEN], 3);
    assert_eq!(histograms[names::INTER_TOKEN_LATENCY] as u64, generated - 3);
    assert_eq!(histograms[names::E2E_REQUEST_LATENCY], 4);
    assert_eq!(histograms[names::REQUEST_QUEUE_TIME], 4);
    assert_eq!(histograms[names::STEP_DURATION] as u64, stats.steps);
    assert_eq!(histograms[names::TOKENS_PER_STEP] as u64, stats.steps);
    for name in names::ALL {
        let present = counters
            .keys()
            .chain(gauges.keys())
            .chain(histograms.keys());
        assert!(
            present.into_iter().any(|k| k.starts_with(name)),
            "{name} was never registered"
        );
    }
}
