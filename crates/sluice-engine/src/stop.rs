//! Turns one sequence's generated tokens into streamed text and decides when it stops.
//!
//! Text is decoded incrementally ([`IncrementalDecoder`]: a character split across tokens is
//! held until complete). Stop strings are matched on that text, so they are found however the
//! tokenizer split them; text that could still be the beginning of a stop string is held back
//! rather than streamed, so a stop string never reaches the client, even in pieces. When the
//! sequence ends for another reason, the held text is released: it was not a stop string.
//!
//! Order of checks for each token: EOS and stop token ids (their own text is never output),
//! then stop strings in the text, then the sequence's length (its `max_tokens`, which the
//! scheduler, holding it, reports: validation keeps it within the context). Before
//! `min_tokens` no stop applies (the sampler also bans EOS and stop ids until then).

use sluice_tokenizer::{IncrementalDecoder, Tokenizer};

use crate::params::StopParams;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the model's context length.
    Length,
    /// Cancelled by the client (abort, or the stream was dropped) or by shutdown.
    Abort,
    /// The engine failed (the model's forward returned an error).
    Error,
}

impl FinishReason {
    pub const ALL: [FinishReason; 4] = [Self::Stop, Self::Length, Self::Abort, Self::Error];

    /// The OpenAI / vLLM spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What exactly stopped a sequence with [`FinishReason::Stop`] (vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// One of the tokenizer's end-of-sequence ids.
    Eos(u32),
    /// One of the request's `stop_token_ids`.
    TokenId(u32),
    /// One of the request's stop strings.
    String(String),
}

/// The stop conditions of a request, resolved once: its [`StopParams`] plus the tokenizer's EOS
/// ids. The token budget is not here: the scheduler's sequence holds it, once.
#[derive(Debug, Clone)]
pub struct StopSpec {
    pub params: StopParams,
    /// EOS ids that end the sequence (empty with `ignore_eos`).
    pub eos_ids: Vec<u32>,
    /// Tokens the sampler bans before `min_tokens`: `eos_ids` and the stop token ids.
    pub banned_early: Vec<u32>,
}

impl StopSpec {
    pub fn new(params: StopParams, tokenizer: &Tokenizer) -> Self {
        let eos_ids = if params.ignore_eos {
            Vec::new()
        } else {
            tokenizer.eos_token_ids().to_vec()
        };
        let mut banned_early = eos_ids.clone();
        banned_early.extend(&params.stop_token_ids);
        banned_early.sort_unstable();
        banned_early.dedup();
        Self {
            params,
            eos_ids,
            banned_early,
        }
    }

    /// Tokens the sampler may not choose for a sequence that has generated `generated` tokens.
    pub fn banned(&self, generated: usize) -> &[u32] {
        if generated < self.params.min_tokens {
            &self.banned_early
        } else {
            &[]
        }
    }
}

/// How a token ended its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub reason: FinishReason,
    pub stop_reason: Option<StopReason>,
}

/// One sequence's text state.
#[derive(Debug, Clone)]
pub struct TextStream {
    decoder: IncrementalDecoder,
    /// Decoded text not yet emitted because a stop string could start in it.
    held: String,
}

impl TextStream {
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            decoder: IncrementalDecoder::new(skip_special_tokens),
            held: String::new(),
        }
    }

    /// Takes the sequence's newest token; `generated` counts it, `at_length` says it is the
    /// last the sequence may generate ([`crate::ScheduledSeq::reached_length`]). Appends the
    /// text that is now safe to show to `delta`, and returns how the sequence ended if this
    /// token ended it.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        spec: &StopSpec,
        token: u32,
        generated: usize,
        at_length: bool,
        delta: &mut String,
    ) -> Option<Stopped> {
        let p = &spec.params;
        let stops_apply = generated >= p.min_tokens;
        if stops_apply {
            let by_id = if spec.eos_ids.contains(&token) {
                Some(StopReason::Eos(token))
            } else if p.stop_token_ids.contains(&token) {
                Some(StopReason::TokenId(token))
            } else {
                None
            };
            if let Some(stop_reason) = by_id {
                self.flush(delta);
                return Some(Stopped {
                    reason: FinishReason::Stop,
                    stop_reason: Some(stop_reason),
                });
            }
        }
        self.held.push_str(self.decoder.push(tokenizer, token));
        if stops_apply {
            if let Some((at, which)) = find_stop(&self.held, &p.stop) {
                let stop = &p.stop[which];
                let end = if p.include_stop_str_in_output {
                    at + stop.len()
                } else {
                    at
                };
                delta.push_str(&self.held[..end]);
                self.held.clear();
                return Some(Stopped {
                    reason: FinishReason::Stop,
                    stop_reason: Some(StopReason::String(stop.clone())),
                });
            }
        }
        if at_length {
            self.flush(delta);
            return Some(Stopped {
                reason: FinishReason::Length,
                stop_reason: None,
            });
        }
        let keep = partial_stop_suffix(&self.held, &p.stop);
        let emit = self.held.len() - keep;
        delta.push_str(&self.held[..emit]);
        self.held.drain(..emit);
        None
    }

    /// Ends the sequence because its grammar is complete: everything held is released, as
    /// at any other stop that is not a stop string.
    pub fn end_by_grammar(&mut self, delta: &mut String) -> Stopped {
        self.flush(delta);
        Stopped {
            reason: FinishReason::Stop,
            stop_reason: None,
        }
    }

    /// Releases everything still held, the decoder's unfinished bytes included (as U+FFFD,
    /// exactly as a full decode would render them).
    fn flush(&mut self, delta: &mut String) {
        delta.push_str(&self.held);
        self.held.clear();
        delta.push_str(&self.decoder.finish());
    }
}

/// The earliest occurrence of any stop string: `(byte offset, index in stops)`; at equal
/// offsets the first listed wins.
fn find_stop(text: &str, stops: &[String]) -> Option<(usize, usize)> {
    stops
        .iter()
        .enumerate()
        .filter_map(|(i, s)| text.find(s.as_str()).map(|at| (at, i)))
        .min()
}

/// Length of the longest suffix of `text` that is a proper prefix of some stop string: text
/// that must be held back because the next tokens could complete a stop string.
fn partial_stop_suffix(text: &str, stops: &[String]) -> usize {
    let mut keep = 0;
    for s in stops {
        let longest = (s.len() - 1).min(text.len());
        for k in (keep + 1..=longest).rev() {
            if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                keep = k;
                break;
            }
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::tiny_tokenizer;

    /// The tiny tokenizer's byte tokens: id = byte.
    fn ids(text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    struct Run {
        deltas: Vec<String>,
        stopped: Option<Stopped>,
        tokens_used: usize,
    }

    fn run((spec, max_tokens): &(StopSpec, usize), tokens: &[u32]) -> Run {
        let tok = tiny_tokenizer();
        let mut text = TextStream::new(spec.params.skip_special_tokens);
        let mut deltas = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            let mut delta = String::new();
            let at_length = i + 1 >= *max_tokens;
            let stopped = text.push(&tok, spec, t, i + 1, at_length, &mut delta);
            deltas.push(delta);
            if stopped.is_some() {
                return Run {
                    deltas,
                    stopped,
                    tokens_used: i + 1,
                };
            }
        }
        Run {
            deltas,
            stopped: None,
            tokens_used: tokens.len(),
        }
    }

    fn spec(params: StopParams, max_tokens: usize) -> (StopSpec, usize) {
        (StopSpec::new(params, &tiny_tokenizer()), max_tokens)
    }

    fn stops(list: &[&str]) -> StopParams {
        StopParams {
            stop: list.iter().map(|s| s.to_string()).collect(),
            ..StopParams::default()
        }
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_cut_and_never_streamed() {
        let r = run(&spec(stops(&["STOP"]), 100), &ids("say ST then STOP now"));
        assert_eq!(r.deltas.concat(), "say ST then ");
        for d in &r.deltas {
            assert!(!d.contains('P') && !d.contains("STO"), "{:?}", r.deltas);
        }
        // "ST" was held back while it could begin "STOP", then released at " ".
        assert_eq!(r.deltas[4], "");
        assert_eq!(r.deltas[5], "");
        assert_eq!(r.deltas[6], "ST ");
        assert_eq!(
            r.stopped,
            Some(Stopped {
                reason: FinishReason::Stop,
                stop_reason: Some(StopReason::String("STOP".into())),
            })
        );
        assert_eq!(r.tokens_used, "say ST then STOP".len());
    }

    #[test]
    fn the_earliest_stop_string_wins_and_can_be_kept() {
        let mut p = stops(&["cd", "bc"]);
        let r = run(&spec(p.clone(), 100), &ids("abcd"));
        assert_eq!(r.deltas.concat(), "a");
        assert_eq!(
            r.stopped.unwrap().stop_reason,
            Some(StopReason::String("bc".into()))
        );
        p.include_stop_str_in_output = true;
        let r = run(&spec(p, 100), &ids("abcd"));
        assert_eq!(r.deltas.concat(), "abc");
    }

    #[test]
    fn held_text_is_released_when_the_sequence_ends_otherwise() {
        let r = run(&spec(stops(&["xyz"]), 4), &ids("abxy"));
        assert_eq!(r.deltas, vec!["a", "b", "", "xy"]);
        assert_eq!(r.stopped.unwrap().reason, FinishReason::Length);
    }

    #[test]
    fn eos_and_stop_token_ids_stop_without_their_text() {
        let tok = tiny_tokenizer();
        let eos = tok.eos_token_ids()[0];
        let mut tokens = ids("hi");
        tokens.push(eos);
        let r = run(&spec(StopParams::default(), 100), &tokens);
        assert_eq!(r.deltas.concat(), "hi");
        assert_eq!(r.stopped.unwrap().stop_reason, Some(StopReason::Eos(eos)));

        let p = StopParams {
            ignore_eos: true,
            skip_special_tokens: false,
            ..StopParams::default()
        };
        let r = run(&spec(p, 3), &tokens);
        assert_eq!(
            r.deltas.concat(),
            format!("hi{}", tok.decode(&[eos], false))
        );
        assert_eq!(r.stopped.unwrap().reason, FinishReason::Length);

        let p = StopParams {
            stop_token_ids: vec![u32::from(b'!')],
            ..StopParams::default()
        };
        let r = run(&spec(p, 100), &ids("yes!no"));
        assert_eq!(r.deltas.concat(), "yes");
        assert_eq!(
            r.stopped.unwrap().stop_reason,
            Some(StopReason::TokenId(u32::from(b'!')))
        );
    }

    #[test]
    fn nothing_stops_before_min_tokens() {
        let tok = tiny_tokenizer();
        let eos = tok.eos_token_ids()[0];
        let p = StopParams {
            min_tokens: 4,
            ..stops(&["a"])
        };
        let s = spec(p, 100);
        assert_eq!(s.0.banned(3), s.0.banned_early.as_slice());
        assert!(s.0.banned(4).is_empty());
        let r = run(
            &s,
            &[
                u32::from(b'a'),
                eos,
                u32::from(b'b'),
                u32::from(b'c'),
                u32::from(b'a'),
            ],
        );
        assert_eq!(r.deltas.concat(), "abc");
        assert_eq!(r.tokens_used, 5);
    }

    #[test]
    fn multibyte_characters_are_never_split_and_stop_strings_match_them() {
        // "é" is C3 A9 and "🦀" F0 9F A6 80: one byte token each.
        let r = run(&spec(stops(&["🦀"]), 100), &ids("é🦀x"));
        assert_eq!(r.deltas, vec!["", "é", "", "", "", ""]);
        assert_eq!(r.stopped.unwrap().reason, FinishReason::Stop);
        // Cut by max_tokens mid-character: the stub renders as U+FFFD, as decode would.
        let r = run(&spec(StopParams::default(), 3), &ids("é🦀"));
        assert_eq!(r.deltas.concat(), "é\u{FFFD}");
    }

    #[test]
    fn the_last_allowed_token_ends_a_sequence_with_length() {
        let tok = tiny_tokenizer();
        let s = StopSpec::new(StopParams::default(), &tok);
        let mut text = TextStream::new(true);
        let mut delta = String::new();
        assert_eq!(
            text.push(&tok, &s, u32::from(b'a'), 1, false, &mut delta),
            None
        );
        let stopped = text.push(&tok, &s, u32::from(b'b'), 2, true, &mut delta);
        assert_eq!(stopped.unwrap().reason, FinishReason::Length);
        assert_eq!(delta, "ab");
    }

    #[test]
    fn partial_suffixes_respect_character_boundaries() {
        let stops = vec!["é!".to_string(), "abc".to_string()];
        assert_eq!(partial_stop_suffix("xé", &stops), "é".len());
        assert_eq!(partial_stop_suffix("xab", &stops), 2);
        assert_eq!(partial_stop_suffix("xabc", &stops), 0);
        assert_eq!(partial_stop_suffix("", &stops), 0);
    }
}
