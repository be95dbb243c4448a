//! Requests with images over the mock model (`MockModel::taking_images`, whose tokens follow
//! each image token's tower row): the image reaches the output, batching and chunking change
//! nothing, the prefix cache serves a resent image and never another one, the images of a
//! step are encoded in one call, cancelled requests give everything back, and what the
//! engine refuses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_engine::testing::{byte_prompt, tiny_tokenizer, MockControl, MockModel, TINY_VOCAB};
use sluice_engine::{
    Engine, EngineConfig, EngineHandle, Event, ImageLimits, InvalidRequest, PromptImage, Request,
    StopParams,
};

const LIMITS: ImageLimits = ImageLimits {
    tokens_per_image: 24,
    pixels_per_image: 12,
};
const WAIT: Duration = Duration::from_secs(30);

/// (images encoded, calls that encoded them).
type Encoded = Arc<(AtomicUsize, AtomicUsize)>;

fn engine_with_control(config: EngineConfig) -> (Engine, Encoded, MockControl) {
    let model = MockModel::new(TINY_VOCAB, 512, 256, 16).taking_images(LIMITS);
    let (encoded, control) = (model.encoded(), model.control());
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), config).unwrap();
    (engine, encoded, control)
}

fn engine(config: EngineConfig) -> (Engine, Encoded) {
    let (engine, encoded, _) = engine_with_control(config);
    (engine, encoded)
}

fn pixels(seed: u32) -> Arc<[f32]> {
    (0..LIMITS.pixels_per_image as u32)
        .map(|i| (seed * 31 + i) as f32)
        .collect()
}

/// `before` text tokens, an image (seed `image`), then `after` text tokens; each request its
/// own text by `seed`.
fn request(seed: u64, before: usize, image: u32, after: usize, max_tokens: usize) -> Request {
    let len = before + LIMITS.tokens_per_image + after;
    Request {
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        images: vec![PromptImage {
            start: before,
            len: LIMITS.tokens_per_image,
            hash: u64::from(image) * 0x9E37_79B9,
            pixels: pixels(image),
        }],
        ..Request::new(byte_prompt(seed, len), max_tokens)
    }
}

/// The tokens and the prompt tokens the cache served.
fn run(h: &EngineHandle, r: Request) -> (Vec<u32>, usize) {
    let events = h.submit(h.validate(r).unwrap()).unwrap().collect_blocking();
    let mut tokens = Vec::new();
    let mut cached = None;
    for e in events {
        match e {
            Event::Token(t) => tokens.push(t.token),
            Event::Finished(f) => cached = Some(f.usage.cached_tokens),
        }
    }
    (tokens, cached.expect("a finish"))
}

/// The tokens of a request's events.
fn tokens_of(events: Vec<Event>) -> Vec<u32> {
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::Token(t) => Some(t.token),
            Event::Finished(_) => None,
        })
        .collect()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_image_decides_and_batching_and_chunking_change_nothing() {
    let (e, _) = engine(EngineConfig::default());
    let h = e.handle();
    let requests: Vec<Request> = (0..8)
        .map(|i| request(i, 5 + 3 * i as usize, i as u32, 7, 12))
        .collect();
    let alone: Vec<Vec<u32>> = requests.iter().map(|r| run(&h, r.clone()).0).collect();
    let other_image = run(&h, request(0, 5, 99, 7, 12)).0;
    assert_ne!(
        alone[0], other_image,
        "another image left the tokens as they were"
    );
    // Eight together.
    let streams: Vec<_> = requests
        .iter()
        .map(|r| h.submit(h.validate(r.clone()).unwrap()).unwrap())
        .collect();
    for (stream, want) in streams.into_iter().zip(&alone) {
        let got = tokens_of(stream.collect_blocking());
        assert_eq!(&got, want, "a request's tokens changed in a crowd");
    }
    drop(e);
    // Budgets that cut the prompts into chunks: each chunk stops before an image or takes it
    // whole, and nothing changes (a fresh engine, so no prefix is cached).
    for budget in [LIMITS.tokens_per_image, 25, 31, 40] {
        let (e, _) = engine(EngineConfig {
            max_num_batched_tokens: budget,
            ..EngineConfig::default()
        });
        let h = e.handle();
        let streams: Vec<_> = requests
            .iter()
            .map(|r| h.submit(h.validate(r.clone()).unwrap()).unwrap())
            .collect();
        for (stream, want) in streams.into_iter().zip(&alone) {
            let got = tokens_of(stream.collect_blocking());
            assert_eq!(
                &got, want,
                "a request's tokens changed under a budget of {budget}"
            );
        }
    }
}

#[test]
fn a_resent_image_is_served_from_the_cache_and_another_never() {
    let (e, encoded) = engine(EngineConfig::default());
    let h = e.handle();
    // 10 text tokens, the image at 10..34, 30 tokens after: blocks of 16 end at 16, 32, 48.
    let (first, cached) = run(&h, request(1, 10, 7, 30, 8));
    assert_eq!(cached, 0);
    assert_eq!(encoded.0.load(Ordering::SeqCst), 1);
    let (again, cached) = run(&h, request(1, 10, 7, 30, 8));
    assert_eq!(
        again, first,
        "the cached image's tokens differ from the cold run's"
    );
    assert_eq!(
        cached, 48,
        "the resent image's blocks were not served from the cache"
    );
    // The whole image was in cached blocks: the tower did not run again.
    assert_eq!(encoded.0.load(Ordering::SeqCst), 1);
    // Another image at the same place: the first block already holds image tokens, so
    // nothing is shared.
    let (other, cached) = run(&h, request(1, 10, 8, 30, 8));
    assert_ne!(other, first);
    assert_eq!(
        cached, 0,
        "a block holding another image's tokens was served from the cache"
    );
    drop(e);
    // A cached prefix that ends inside the image (the image at 4..28: the first block holds 4
    // text tokens and 12 of the image's, left by a shorter prompt with the same image): the
    // rest of the image is computed on it, and the tokens are the cold run's.
    let cold = {
        let (e, _) = engine(EngineConfig::default());
        run(&e.handle(), request(2, 4, 9, 30, 8)).0
    };
    let (e, _) = engine(EngineConfig::default());
    let h = e.handle();
    let mut shorter = request(2, 4, 9, 30, 8);
    shorter.prompt.truncate(4 + LIMITS.tokens_per_image + 3);
    run(&h, shorter);
    let (again, cached) = run(&h, request(2, 4, 9, 30, 8));
    assert_eq!(
        cached, 16,
        "the shorter prompt's first block was not served"
    );
    assert_eq!(
        again, cold,
        "tokens after a cached prefix that ends inside the image"
    );
}

#[test]
fn a_steps_images_are_encoded_in_one_call() {
    let (e, encoded, control) = engine_with_control(EngineConfig::default());
    let h = e.handle();
    let submit = |i: u64| {
        h.submit(h.validate(request(i, 3, 20 + i as u32, 2, 4)).unwrap())
            .unwrap()
    };
    // The first request's step waits in the forward while seven more arrive: the next step
    // admits them together.
    control.hold();
    let mut streams = vec![submit(0)];
    assert!(control.wait_until_held(1, WAIT));
    streams.extend((1..8).map(submit));
    wait_until("the seven wait", || h.stats().waiting == 7);
    control.open();
    for s in streams {
        s.collect_blocking();
    }
    let (images, calls) = (
        encoded.0.load(Ordering::SeqCst),
        encoded.1.load(Ordering::SeqCst),
    );
    assert_eq!((images, calls), (8, 2), "images, and the tower's calls");
}

#[test]
fn cancelled_image_requests_give_everything_back() {
    let (e, _) = engine(EngineConfig {
        max_num_batched_tokens: 32,
        ..EngineConfig::default()
    });
    let h = e.handle();
    for round in 0..5 {
        let streams: Vec<_> = (0..16)
            .map(|i| {
                h.submit(
                    h.validate(request(i + 100 * round, 9, i as u32, 40, 64))
                        .unwrap(),
                )
                .unwrap()
            })
            .collect();
        // Dropped at once, after a step, and after a few.
        for (i, s) in streams.into_iter().enumerate() {
            if i % 3 == 0 {
                drop(s);
            } else {
                std::thread::sleep(Duration::from_micros(200 * (i % 4) as u64));
                drop(s);
            }
        }
    }
    wait_until("every block is back", || {
        let s = h.stats();
        s.kv_blocks_used == 0 && s.running == 0 && s.waiting == 0
    });
}

#[test]
fn images_the_engine_refuses() {
    // A text model.
    let text = Engine::start(
        Box::new(MockModel::new(TINY_VOCAB, 512, 64, 16)),
        tiny_tokenizer(),
        EngineConfig::default(),
    )
    .unwrap();
    let err = text.handle().validate(request(1, 3, 1, 3, 4)).unwrap_err();
    assert!(
        matches!(
            err,
            InvalidRequest::Param {
                param: "images",
                ..
            }
        ),
        "{err}"
    );
    let (e, _) = engine(EngineConfig::default());
    let h = e.handle();
    let mut wrong_len = request(1, 3, 1, 3, 4);
    wrong_len.images[0].len -= 1;
    let mut outside = request(1, 3, 1, 3, 4);
    outside.images[0].start = 10;
    let mut overlapping = request(1, 3, 1, 30, 4);
    overlapping.images.push(PromptImage {
        start: 20,
        ..overlapping.images[0].clone()
    });
    let mut few_pixels = request(1, 3, 1, 3, 4);
    few_pixels.images[0].pixels = pixels(1)[..3].into();
    for (r, what) in [
        (wrong_len, "tokens"),
        (outside, "leaves"),
        (overlapping, "overlaps"),
        (few_pixels, "pixel"),
    ] {
        let err = h.validate(r).unwrap_err();
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
    // An image larger than a step's budget could never be scheduled whole.
    let model = MockModel::new(TINY_VOCAB, 512, 64, 16).taking_images(LIMITS);
    let refused = Engine::start(
        Box::new(model),
        tiny_tokenizer(),
        EngineConfig {
            max_num_batched_tokens: LIMITS.tokens_per_image - 1,
            ..EngineConfig::default()
        },
    );
    assert!(refused.is_err_and(|e| e.to_string().contains("max_num_batched_tokens")));
}
