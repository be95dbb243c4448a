//! The engine loop over the mock model: event order, `n > 1`, aborts and dropped streams,
//! failed forwards, backpressure, validation, stop handling, seeds and shutdown.

use std::time::{Duration, Instant};

use sluice_engine::testing::{
    byte_prompt, tiny_tokenizer, MockControl, MockModel, TINY_ENDOFTEXT, TINY_VOCAB,
};
use sluice_engine::{
    Engine, EngineConfig, EngineHandle, Event, FinishEvent, FinishReason, InvalidRequest,
    MaxTokensPolicy, Request, RequestStream, SamplingParams, StopParams, StopReason, SubmitError,
};

const WAIT: Duration = Duration::from_secs(30);

fn start(config: EngineConfig, num_blocks: usize) -> (Engine, MockControl) {
    let model = MockModel::new(TINY_VOCAB, 512, num_blocks, 16);
    let control = model.control();
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), config).unwrap();
    (engine, control)
}

fn default_engine() -> (Engine, MockControl) {
    start(EngineConfig::default(), 256)
}

/// A request that runs exactly `max_tokens` tokens.
fn long_request(seed: u64, prompt_len: usize, max_tokens: usize) -> Request {
    Request {
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        ..Request::new(byte_prompt(seed, prompt_len), max_tokens)
    }
}

/// Validates (the requests here are valid unless a test says otherwise) and submits.
fn submit(h: &EngineHandle, request: Request) -> Result<RequestStream, SubmitError> {
    h.submit(h.validate(request).expect("a valid request"))
}

#[derive(Debug, Default, Clone)]
struct Output {
    tokens: Vec<u32>,
    deltas: Vec<String>,
    finish: Option<FinishEvent>,
}

impl Output {
    fn text(&self) -> String {
        self.deltas.concat()
    }

    fn reason(&self) -> FinishReason {
        self.finish.as_ref().expect("finished").reason
    }
}

/// Collects a request's events per sequence, checking the protocol on the way: tokens, then
/// exactly one finish, then nothing for that sequence.
fn collect(events: Vec<Event>, n: usize) -> Vec<Output> {
    let mut out = vec![Output::default(); n];
    for event in events {
        let seq = &mut out[event.index() as usize];
        assert!(
            seq.finish.is_none(),
            "event after the finish of {}: {event:?}",
            event.index()
        );
        match event {
            Event::Token(t) => {
                seq.tokens.push(t.token);
                seq.deltas.push(t.text);
            }
            Event::Finished(f) => {
                assert_eq!(f.usage.completion_tokens, seq.tokens.len());
                seq.finish = Some(f);
            }
        }
    }
    for (i, seq) in out.iter().enumerate() {
        assert!(seq.finish.is_some(), "sequence {i} never finished");
    }
    out
}

fn run(handle: &EngineHandle, request: Request) -> Vec<Output> {
    let n = request.n;
    collect(submit(handle, request).unwrap().collect_blocking(), n)
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_handle_and_streams_can_move_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<EngineHandle>();
    send::<sluice_engine::RequestStream>();
    send::<Engine>();
}

#[test]
fn events_are_tokens_then_one_finish_and_batching_changes_nothing() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    let tok = tiny_tokenizer();
    let requests: Vec<Request> = (0..12)
        .map(|i| long_request(i, 5 + 7 * i as usize, 3 + i as usize))
        .collect();
    let alone: Vec<Vec<Output>> = requests.iter().map(|r| run(&h, r.clone())).collect();
    let streams: Vec<_> = requests
        .iter()
        .map(|r| submit(&h, r.clone()).unwrap())
        .collect();
    for ((stream, r), alone) in streams.into_iter().zip(&requests).zip(&alone) {
        let out = collect(stream.collect_blocking(), 1);
        let seq = &out[0];
        assert_eq!(seq.tokens, alone[0].tokens, "same tokens batched as alone");
        assert_eq!(seq.tokens.len(), r.max_tokens.unwrap());
        assert_eq!(seq.reason(), FinishReason::Length);
        assert_eq!(seq.text(), tok.decode(&seq.tokens, true));
        let f = seq.finish.as_ref().unwrap();
        assert_eq!(f.usage.prompt_tokens, r.prompt.len());
        let t = f.timing;
        assert!(
            t.arrival <= t.scheduled.unwrap() && t.scheduled.unwrap() <= t.first_token.unwrap()
        );
        assert!(
            t.first_token.unwrap() <= t.last_token.unwrap() && t.last_token.unwrap() <= t.finished
        );
    }
    wait_until("the pool is empty", || h.stats().kv_blocks_used == 0);
    let stats = h.stats();
    assert_eq!((stats.running, stats.waiting), (0, 0));
}

#[test]
fn n_sequences_share_the_prompt_and_sample_independently() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    let request = Request {
        n: 2,
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(7),
            ..SamplingParams::default()
        },
        ..long_request(1, 40, 12)
    };
    let first = run(&h, request.clone());
    assert_eq!(first.len(), 2);
    for seq in &first {
        assert_eq!(seq.tokens.len(), 12);
        assert_eq!(seq.reason(), FinishReason::Length);
    }
    assert_ne!(
        first[0].tokens, first[1].tokens,
        "each sequence has its own generator"
    );
    let again = run(&h, request);
    for (a, b) in first.iter().zip(&again) {
        assert_eq!(a.tokens, b.tokens, "a seed reproduces every sequence");
    }
    // Sequence 1 found sequence 0's two full prompt blocks in the prefix cache.
    assert!(h.stats().prefix_cache.hits >= 32, "{:?}", h.stats());
    // The first run computed its prompt; the second found its two full blocks cached, and
    // each finish says so.
    let usage = |o: &Output| o.finish.as_ref().expect("finished").usage;
    assert_eq!(usage(&first[0]).cached_tokens, 0);
    assert_eq!(usage(&again[0]).cached_tokens, 32);
    assert_eq!(usage(&again[0]).prompt_tokens, 40);
}

#[test]
fn aborting_frees_the_blocks_at_once() {
    let (engine, control) = default_engine();
    let h = engine.handle();
    control.hold();
    let stream = submit(&h, long_request(3, 40, 400)).unwrap();
    assert!(control.wait_until_held(1, WAIT));
    control.release(1);
    // Mid-way through the second step: the sequence holds blocks.
    assert!(control.wait_until_held(2, WAIT));
    assert!(h.stats().kv_blocks_used > 0, "{:?}", h.stats());
    h.abort(stream.id());
    control.open();
    let rest = stream.collect_blocking();
    let Some(Event::Finished(f)) = rest.last() else {
        panic!("no finish after abort: {rest:?}");
    };
    assert_eq!(f.reason, FinishReason::Abort);
    // The engine frees the blocks before it sends the finish.
    assert_eq!(h.stats().kv_blocks_used, 0);
    assert_eq!(h.stats().running, 0);
}

#[test]
fn dropping_the_stream_aborts_by_the_end_of_the_step() {
    let (engine, control) = default_engine();
    let h = engine.handle();
    control.hold();
    let stream = submit(&h, long_request(4, 20, 400)).unwrap();
    assert!(
        control.wait_until_held(1, WAIT),
        "the first step reached the model"
    );
    drop(stream);
    control.release(1);
    wait_until("the step ended", || h.stats().steps == 1);
    let s = h.stats();
    assert_eq!((s.kv_blocks_used, s.running), (0, 0), "{s:?}");
    assert_eq!(control.forwards(), 1, "no step ran after the one in flight");
    control.open();
}

#[test]
fn a_failed_forward_fails_that_steps_requests_and_the_engine_goes_on() {
    let (engine, control) = start(
        EngineConfig {
            max_num_seqs: 2,
            ..EngineConfig::default()
        },
        256,
    );
    let h = engine.handle();
    control.hold();
    let a = submit(&h, long_request(5, 10, 20)).unwrap();
    assert!(control.wait_until_held(1, WAIT));
    // B and C join the next step; D waits for a free seat.
    let b = submit(&h, long_request(6, 10, 20)).unwrap();
    let c = submit(&h, long_request(7, 10, 20)).unwrap();
    let d = submit(&h, long_request(8, 10, 20)).unwrap();
    control.release(1);
    assert!(control.wait_until_held(2, WAIT));
    control.fail_next(1);
    control.open();
    let a = collect(a.collect_blocking(), 1);
    let b = collect(b.collect_blocking(), 1);
    let c = collect(c.collect_blocking(), 1);
    let d = collect(d.collect_blocking(), 1);
    // A ran in both steps, B joined the failing one; C and D were never in it.
    assert_eq!(a[0].reason(), FinishReason::Error);
    assert_eq!(a[0].tokens.len(), 1);
    assert_eq!(b[0].reason(), FinishReason::Error);
    let error = a[0].finish.as_ref().unwrap().error.clone().unwrap();
    assert!(error.contains("injected failure"), "{error}");
    for survivor in [&c[0], &d[0]] {
        assert_eq!(survivor.reason(), FinishReason::Length);
        assert_eq!(survivor.tokens.len(), 20);
    }
    let later = run(&h, long_request(9, 10, 5));
    assert_eq!(later[0].reason(), FinishReason::Length);
    let stats = h.stats();
    assert_eq!(stats.failed_steps, 1);
    assert_eq!(stats.kv_blocks_used, 0);
}

#[test]
fn submissions_past_max_waiting_are_refused_as_overloaded() {
    let (engine, control) = start(
        EngineConfig {
            max_num_seqs: 1,
            max_waiting: 3,
            ..EngineConfig::default()
        },
        256,
    );
    let h = engine.handle();
    control.hold();
    let a = submit(&h, long_request(1, 10, 4)).unwrap();
    assert!(
        control.wait_until_held(1, WAIT),
        "A runs, the engine is mid-step"
    );
    let b = submit(&h, long_request(2, 10, 4)).unwrap();
    let c = submit(
        &h,
        Request {
            n: 2,
            ..long_request(3, 10, 4)
        },
    )
    .unwrap();
    assert_eq!(h.stats().waiting, 3);
    let refused = submit(&h, long_request(4, 10, 4)).unwrap_err();
    assert_eq!(
        refused,
        SubmitError::Overloaded {
            waiting: 3,
            max_waiting: 3
        }
    );
    assert_eq!(
        h.validate(Request {
            n: 4,
            ..long_request(5, 10, 4)
        }),
        Err(InvalidRequest::InvalidN { n: 4, max: 3 }),
        "a request larger than the whole queue is invalid, not overloaded"
    );
    control.open();
    for (stream, n) in [(a, 1), (b, 1), (c, 2)] {
        for seq in collect(stream.collect_blocking(), n) {
            assert_eq!(seq.reason(), FinishReason::Length);
        }
    }
    // Room again.
    assert_eq!(run(&h, long_request(6, 10, 2))[0].tokens.len(), 2);
}

#[test]
fn a_request_validated_for_another_engine_is_refused() {
    let (small, _) = start(EngineConfig::default(), 4);
    let (large, _) = default_engine();
    let checked_for_large = large.handle().validate(long_request(1, 10, 100)).unwrap();
    assert_eq!(
        small.handle().submit(checked_for_large).unwrap_err(),
        SubmitError::ForeignLimits,
        "the small engine's cache could never hold it"
    );
    assert_eq!(small.handle().stats().in_flight(), 0);
}

#[test]
fn invalid_requests_are_refused_before_queueing() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    let limits = h.limits();
    assert_eq!(limits.vocab_size, TINY_VOCAB);
    assert_eq!(limits.kv_cache_tokens, 256 * 16);
    let cases = [
        Request::new(vec![], 4),
        Request::new(vec![TINY_VOCAB as u32], 4),
        // A prompt that alone fills the context (512 tokens).
        Request::new(byte_prompt(1, 512), 4),
        Request {
            sampling: SamplingParams {
                top_p: 1.5,
                ..SamplingParams::default()
            },
            ..Request::new(byte_prompt(1, 10), 4)
        },
    ];
    for request in cases {
        match h.validate(request.clone()) {
            Err(e) => assert!(!e.to_string().is_empty()),
            other => panic!("{request:?} gave {other:?}"),
        }
    }
    assert_eq!(h.stats().in_flight(), 0);
}

/// A budget past the context is lowered to what the context leaves (the default policy), the
/// answer then ends at the context's end; the strict policy refuses it.
#[test]
fn max_tokens_past_the_context_is_clamped_or_refused() {
    let model = MockModel::new(TINY_VOCAB, 40, 64, 16);
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), EngineConfig::default()).unwrap();
    let h = engine.handle();
    let out = run(&h, long_request(2, 30, 600));
    assert_eq!(out[0].tokens.len(), 10);
    assert_eq!(out[0].reason(), FinishReason::Length);
    let strict = EngineConfig {
        max_tokens_policy: MaxTokensPolicy::Strict,
        ..EngineConfig::default()
    };
    let model = MockModel::new(TINY_VOCAB, 40, 64, 16);
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), strict).unwrap();
    assert!(matches!(
        engine.handle().validate(long_request(2, 30, 600)),
        Err(InvalidRequest::TooManyTokens {
            prompt_tokens: 30,
            max_tokens: 600,
            capacity: 40
        })
    ));
    assert_eq!(
        engine
            .handle()
            .validate(long_request(2, 30, 10))
            .map(|v| v.max_tokens()),
        Ok(10)
    );
}

#[test]
fn max_tokens_defaults_to_the_rest_of_the_context() {
    let model = MockModel::new(TINY_VOCAB, 40, 64, 16);
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), EngineConfig::default()).unwrap();
    let h = engine.handle();
    let request = Request {
        max_tokens: None,
        ..long_request(2, 30, 1)
    };
    let out = run(&h, request);
    assert_eq!(out[0].tokens.len(), 10);
    assert_eq!(out[0].reason(), FinishReason::Length);
}

#[test]
fn stop_strings_cut_the_text_and_never_stream() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    let tok = tiny_tokenizer();
    // Printable ASCII only, so the text is exactly one character per token.
    let ascii: Vec<(u32, f32)> = (0..TINY_VOCAB as u32)
        .filter(|&t| t > 255 || !(t as u8).is_ascii_lowercase())
        .map(|t| (t, -100.0))
        .collect();
    let base = Request {
        sampling: SamplingParams {
            logit_bias: ascii,
            ..SamplingParams::greedy()
        },
        ..long_request(11, 12, 40)
    };
    let full = run(&h, base.clone())[0].text();
    assert_eq!(full.len(), 40, "{full:?}");
    let stop = full[17..20].to_string();
    let expected = &full[..full.find(&stop).unwrap()];
    let request = Request {
        stop: StopParams {
            stop: vec!["never seen".into(), stop.clone()],
            ignore_eos: true,
            ..StopParams::default()
        },
        ..base.clone()
    };
    let out = run(&h, request.clone());
    let seq = &out[0];
    assert_eq!(seq.text(), expected);
    assert_eq!(seq.reason(), FinishReason::Stop);
    assert_eq!(
        seq.finish.as_ref().unwrap().stop_reason,
        Some(StopReason::String(stop.clone()))
    );
    for d in &seq.deltas {
        assert!(!d.contains(&stop));
    }
    assert_eq!(seq.tokens.len(), expected.len() + stop.len());
    assert_eq!(tok.decode(&seq.tokens, true), format!("{expected}{stop}"));

    let kept = run(
        &h,
        Request {
            stop: StopParams {
                include_stop_str_in_output: true,
                ..request.stop.clone()
            },
            ..base
        },
    );
    assert_eq!(kept[0].text(), format!("{expected}{stop}"));
}

#[test]
fn min_tokens_holds_off_eos() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    let eos_first = Request {
        sampling: SamplingParams {
            logit_bias: vec![(TINY_ENDOFTEXT, 100.0)],
            ..SamplingParams::greedy()
        },
        ..Request::new(byte_prompt(3, 8), 20)
    };
    let out = run(&h, eos_first.clone());
    assert_eq!(out[0].tokens, vec![TINY_ENDOFTEXT]);
    assert_eq!(
        out[0].finish.as_ref().unwrap().stop_reason,
        Some(StopReason::Eos(TINY_ENDOFTEXT))
    );
    let out = run(
        &h,
        Request {
            stop: StopParams {
                min_tokens: 5,
                ..StopParams::default()
            },
            ..eos_first
        },
    );
    // As in vLLM: EOS is banned while fewer than `min_tokens` tokens exist, so it comes sixth.
    let seq = &out[0];
    assert_eq!(seq.tokens.len(), 6);
    assert!(!seq.tokens[..5].contains(&TINY_ENDOFTEXT));
    assert_eq!(seq.tokens[5], TINY_ENDOFTEXT);
    assert_eq!(seq.reason(), FinishReason::Stop);
}

#[test]
fn a_seeded_request_gives_the_same_tokens_in_any_batch() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    let seeded = Request {
        sampling: SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: Some(1234),
            ..SamplingParams::default()
        },
        ..long_request(21, 17, 24)
    };
    let alone = run(&h, seeded.clone());
    let others: Vec<_> = (0..15)
        .map(|i| {
            let r = Request {
                sampling: SamplingParams {
                    temperature: 1.0,
                    ..SamplingParams::default()
                },
                ..long_request(100 + i, 5 + i as usize, 30)
            };
            submit(&h, r).unwrap()
        })
        .collect();
    let batched = run(&h, seeded);
    assert_eq!(alone[0].tokens, batched[0].tokens);
    for s in others {
        collect(s.collect_blocking(), 1);
    }
}

#[test]
fn logprobs_are_streamed_with_their_tokens() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    let request = Request {
        sampling: SamplingParams {
            logprobs: Some(3),
            ..SamplingParams::greedy()
        },
        ..long_request(5, 9, 6)
    };
    let events = submit(&h, request).unwrap().collect_blocking();
    let mut tokens = 0;
    for e in events {
        if let Event::Token(t) = e {
            tokens += 1;
            let lp = t.logprobs.expect("logprobs requested");
            assert_eq!(lp.token, t.token);
            assert_eq!(lp.top.len(), 3);
            // Greedy: the chosen token is the most likely one.
            assert_eq!(lp.top[0].0, t.token);
            assert!((lp.top[0].1 - lp.logprob).abs() < 1e-6);
            assert!(lp.logprob <= 0.0 && lp.top[1].1 <= lp.top[0].1);
        }
    }
    assert_eq!(tokens, 6);
}

#[test]
fn shutdown_drains_what_is_in_flight_and_refuses_the_rest() {
    let (engine, _) = default_engine();
    let h = engine.handle();
    assert!(h.is_running());
    let streams: Vec<_> = (0..4)
        .map(|i| submit(&h, long_request(i, 10, 30)).unwrap())
        .collect();
    let report = engine.shutdown(WAIT);
    assert!(report.drained, "{report:?}");
    assert!(
        !h.is_running(),
        "a health check must see that the engine thread has exited"
    );
    assert_eq!(report.aborted, 0);
    for s in streams {
        assert_eq!(
            collect(s.collect_blocking(), 1)[0].reason(),
            FinishReason::Length
        );
    }
    assert_eq!(
        submit(&h, long_request(9, 10, 3)).unwrap_err(),
        SubmitError::ShuttingDown
    );
}

#[test]
fn shutdown_aborts_what_outlives_the_deadline() {
    let (engine, control) = default_engine();
    let h = engine.handle();
    control.hold();
    let stream = submit(&h, long_request(1, 10, 100)).unwrap();
    assert!(control.wait_until_held(1, WAIT));
    let opener = {
        let control = control.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            control.open();
        })
    };
    let report = engine.shutdown(Duration::from_millis(10));
    opener.join().unwrap();
    assert!(!report.drained);
    assert_eq!(report.aborted, 1);
    let out = collect(stream.collect_blocking(), 1);
    assert_eq!(out[0].reason(), FinishReason::Abort);
}
