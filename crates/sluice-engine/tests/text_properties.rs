//! Property tests of the text path every generated token takes (the fuzzing of tokenization
//! and detokenization): the GGUF-built tokenizer round-trips any string; the incremental
//! detokenizer streams exactly what a full decode gives; and stop-string handling streams
//! exactly the full decode cut at the first stop string, never holding back more than a stop
//! string could need. The tiny byte-level tokenizer runs in every case; the real SmolLM2
//! tokenizer too (found at `$SLUICE_MODEL` or in `models/`; missing, the test fails naming the
//! fetch script).
//!
//! These live here rather than in sluice-model because the stop handling they end in is the
//! engine's. Case counts are small so `cargo test` stays quick; `PROPTEST_CASES=20000 cargo
//! test --release -p sluice-engine --test text_properties` runs a longer campaign.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice_engine::stop::{StopSpec, TextStream};
use sluice_engine::testing::tiny_tokenizer;
use sluice_engine::{FinishReason, StopParams, StopReason};
use sluice_tokenizer::{IncrementalDecoder, Tokenizer};

/// `PROPTEST_CASES` when set, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(default_cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases: cases(default_cases),
        failure_persistence: None,
        ..Config::default()
    })
}

fn run<S: Strategy>(
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    if let Err(e) = runner(default_cases).run(&strategy, test) {
        panic!("{e}");
    }
}

fn real_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = match std::env::var_os("SLUICE_MODEL") {
                Some(p) => PathBuf::from(p),
                None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            };
            assert!(
                path.is_file(),
                "model not found at {}: run scripts/fetch-model.sh (or set SLUICE_MODEL)",
                path.display()
            );
            let file = sluice_model::GgufFile::open(&path).expect("the model file opens");
            Arc::new(file.tokenizer().expect("its tokenizer loads"))
        })
        .clone()
}

/// Text a tokenizer meets: arbitrary Unicode, and realistic mixes of words, digits,
/// punctuation, whitespace runs, emoji, CJK and the chat template's control tokens.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[A-Za-z]{1,10}",
        "[0-9]{1,6}",
        "[ \t\n]{1,4}",
        "[.,;:!?'\"()\\[\\]{}<>/\\\\@#$%^&*_=+~`|-]{1,3}",
        "[é你好ßøΩ🦀😀👍🏽]{1,3}",
        prop::sample::select(vec![
            "<|im_start|>",
            "<|im_end|>",
            "<|endoftext|>",
            "'s",
            "'ll",
            " the",
            "\r\n",
            "\u{0}",
            "\u{fffd}",
            "\u{200d}",
        ])
        .prop_map(String::from),
    ];
    prop_oneof![any::<String>(), vec(piece, 0..24).prop_map(|p| p.concat()),]
}

fn check_round_trip(tok: &Tokenizer, text: &str) -> Result<(), TestCaseError> {
    let ids = tok
        .encode(text)
        .map_err(|e| TestCaseError::fail(format!("{text:?} does not encode: {e}")))?;
    prop_assert!(
        ids.iter().all(|&id| (id as usize) < tok.vocab_size()),
        "{text:?}: ids outside the vocabulary: {ids:?}"
    );
    prop_assert_eq!(tok.decode(&ids, false), text, "ids {:?}", ids);
    // Deterministic: the same text, the same ids.
    prop_assert_eq!(tok.encode(text).unwrap(), ids);
    Ok(())
}

#[test]
fn the_tiny_tokenizer_round_trips_any_text() {
    let tok = tiny_tokenizer();
    run(1024, text(), |s| check_round_trip(&tok, &s));
}

#[test]
fn the_real_tokenizer_round_trips_any_text() {
    let tok = real_tokenizer();
    run(1024, text(), |s| check_round_trip(&tok, &s));
}

/// Ids biased toward the hard cases: single bytes that split UTF-8 characters (and invalid
/// sequences), special tokens, and arbitrary vocabulary entries.
fn ids(tok: &Tokenizer) -> impl Strategy<Value = Vec<u32>> {
    let vocab = tok.vocab_size() as u32;
    let specials: Vec<u32> = (0..vocab).filter(|&id| tok.is_special(id)).collect();
    let single_bytes: Vec<u32> = (0..vocab)
        .filter(|&id| !tok.is_special(id) && tok.token_bytes(id).len() == 1)
        .collect();
    let id = prop_oneof![
        4 => prop::sample::select(single_bytes),
        1 => prop::sample::select(specials),
        3 => 0..vocab,
    ];
    vec(id, 0..40)
}

fn check_incremental_decode(tok: &Tokenizer, ids: &[u32], skip: bool) -> Result<(), TestCaseError> {
    let mut decoder = IncrementalDecoder::new(skip);
    let mut streamed = String::new();
    for &id in ids {
        streamed.push_str(decoder.push(tok, id));
    }
    streamed.push_str(&decoder.finish());
    prop_assert_eq!(
        streamed,
        tok.decode(ids, skip),
        "ids {:?} skip {}",
        ids,
        skip
    );
    Ok(())
}

#[test]
fn incremental_detokenization_equals_a_full_decode() {
    for tok in [tiny_tokenizer(), real_tokenizer()] {
        let strategy = (ids(&tok), any::<bool>());
        run(1024, strategy, |(ids, skip)| {
            check_incremental_decode(&tok, &ids, skip)
        });
    }
}

/// A generated sequence and stop strings for it: some cut from its own text (so they do
/// match, wherever the token boundaries fall), some arbitrary.
fn stop_case(tok: Arc<Tokenizer>) -> impl Strategy<Value = (Vec<u32>, StopParams)> {
    (ids(&tok), any::<bool>(), any::<bool>(), any::<bool>()).prop_flat_map(
        move |(ids, skip, keep_stop, ignore_eos)| {
            let text = tok.decode(&ids, skip);
            let chars: Vec<char> = text.chars().collect();
            let n = chars.len();
            let from_text = (0..n.max(1), 1..6usize).prop_map(move |(start, len)| {
                chars[start.min(n)..(start + len).min(n)]
                    .iter()
                    .collect::<String>()
            });
            let stop = prop_oneof![
                3 => from_text,
                1 => "[a-z ]{1,4}",
                1 => "[é🦀<|>]{1,3}",
            ];
            // U+FFFD is left out of stop strings: a full decode of a prefix ends in one where
            // the stream still holds the bytes of an unfinished character.
            let stops = vec(stop, 0..4).prop_map(|v| {
                v.into_iter()
                    .filter(|s| !s.is_empty() && !s.contains('\u{fffd}'))
                    .collect::<Vec<String>>()
            });
            let ids = Just(ids.clone());
            (ids, stops).prop_map(move |(ids, stop)| {
                (
                    ids,
                    StopParams {
                        stop,
                        ignore_eos,
                        include_stop_str_in_output: keep_stop,
                        skip_special_tokens: skip,
                        ..StopParams::default()
                    },
                )
            })
        },
    )
}

/// What the client must see: the full decode of what was generated, ended by the first EOS
/// (without its text) or cut at the earliest stop string, as soon as one appears.
fn expected(tok: &Tokenizer, ids: &[u32], p: &StopParams) -> (String, usize, FinishReason) {
    let eos = tok.eos_token_ids();
    for i in 0..ids.len() {
        if !p.ignore_eos && eos.contains(&ids[i]) {
            return (
                tok.decode(&ids[..i], p.skip_special_tokens),
                i + 1,
                FinishReason::Stop,
            );
        }
        let text = tok.decode(&ids[..=i], p.skip_special_tokens);
        let first = p
            .stop
            .iter()
            .enumerate()
            .filter_map(|(k, s)| text.find(s.as_str()).map(|at| (at, k)))
            .min();
        if let Some((at, k)) = first {
            let end = if p.include_stop_str_in_output {
                at + p.stop[k].len()
            } else {
                at
            };
            return (text[..end].to_string(), i + 1, FinishReason::Stop);
        }
    }
    (
        tok.decode(ids, p.skip_special_tokens),
        ids.len(),
        FinishReason::Length,
    )
}

fn check_stop_stream(
    tok: &Tokenizer,
    ids: &[u32],
    params: StopParams,
) -> Result<(), TestCaseError> {
    let max_tokens = ids.len().max(1);
    let spec = StopSpec::new(params.clone(), tok);
    let longest_stop = params.stop.iter().map(String::len).max().unwrap_or(0);
    let mut stream = TextStream::new(params.skip_special_tokens);
    let mut streamed = String::new();
    let mut stopped = None;
    let mut used = 0;
    for (i, &id) in ids.iter().enumerate() {
        let mut delta = String::new();
        stopped = stream.push(tok, &spec, id, i + 1, i + 1 >= max_tokens, &mut delta);
        streamed.push_str(&delta);
        used = i + 1;
        if stopped.is_some() {
            break;
        }
        // Between tokens: what streamed is a prefix of the text so far, and what is held back
        // is no more than a stop string's proper prefix plus an unfinished character.
        let so_far = tok.decode(&ids[..=i], params.skip_special_tokens);
        prop_assert!(
            so_far.starts_with(&streamed),
            "streamed {:?} is not a prefix of {:?}",
            streamed,
            so_far
        );
        let held = so_far.len() - streamed.len();
        prop_assert!(
            held <= longest_stop.saturating_sub(1) + '\u{fffd}'.len_utf8(),
            "{held} bytes held back ({streamed:?} of {so_far:?}); longest stop {longest_stop}"
        );
    }
    let (text, tokens, reason) = expected(tok, ids, &params);
    prop_assert_eq!(&streamed, &text, "ids {:?} params {:?}", ids, params);
    if !ids.is_empty() {
        let stopped = stopped.expect("the last token ends the sequence at the latest");
        prop_assert_eq!(stopped.reason, reason);
        prop_assert_eq!(used, tokens);
        if let Some(StopReason::String(s)) = &stopped.stop_reason {
            prop_assert!(params.stop.contains(s));
        }
    }
    if !params.include_stop_str_in_output {
        for s in &params.stop {
            prop_assert!(
                !streamed.contains(s.as_str()),
                "{s:?} streamed in {streamed:?}"
            );
        }
    }
    Ok(())
}

#[test]
fn streamed_text_is_the_full_decode_cut_at_the_first_stop_string() {
    for tok in [tiny_tokenizer(), real_tokenizer()] {
        run(2048, stop_case(tok.clone()), |(ids, params)| {
            check_stop_stream(&tok, &ids, params)
        });
    }
}
