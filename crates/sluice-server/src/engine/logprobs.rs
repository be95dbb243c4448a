//! The engine's per-token log-probabilities in the two shapes OpenAI uses: the completions
//! API's parallel lists and the chat API's list of token objects.
//!
//! A token is shown as vLLM shows it: its text, control tokens included (`<|im_end|>`, so a
//! client can tell the end of a turn from an empty token), or, when its bytes are not valid
//! UTF-8 on their own (a fragment of a multi-byte character), `bytes:` followed by each byte as
//! `\xNN`. The chat shape's `bytes` field always holds the token's exact bytes.

use std::collections::HashMap;

use sluice_engine::TokenLogprobs;
use sluice_tokenizer::Tokenizer;

use crate::openai::chat::{ChatTokenLogprob, ChatTopLogprob};
use crate::openai::common::finite_logprob;
use crate::openai::completions::CompletionLogprobs;

/// A token's text as logprobs show it (see the module docs).
pub fn token_text(tokenizer: &Tokenizer, token: u32) -> String {
    let bytes = tokenizer.token_bytes(token);
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => escaped_bytes(bytes),
    }
}

/// `bytes:\xe2\x80`: how OpenAI and vLLM name a token that is no whole character.
fn escaped_bytes(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(6 + 4 * bytes.len());
    out.push_str("bytes:");
    for b in bytes {
        let _ = write!(out, "\\x{b:02x}");
    }
    out
}

/// Where the next token of a completion choice starts in its text, in characters: the text
/// holds what the tokens' bytes decode to, so a character split over two tokens starts at the
/// token that completes it, and a skipped control token adds nothing.
#[derive(Debug, Default)]
pub struct TextOffset {
    chars: usize,
    /// The start of a character whose remaining bytes have not come yet.
    pending: Vec<u8>,
}

impl TextOffset {
    /// Starts after `text` (an echoed prompt).
    pub fn after(text: &str) -> Self {
        Self {
            chars: text.chars().count(),
            pending: Vec::new(),
        }
    }

    /// The offset of a token adding `bytes` to the text; moves past them.
    fn advance(&mut self, bytes: &[u8]) -> usize {
        let at = self.chars;
        self.pending.extend_from_slice(bytes);
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    self.chars += text.chars().count();
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    self.chars += std::str::from_utf8(valid).map_or(0, |t| t.chars().count());
                    match e.error_len() {
                        // An invalid sequence decodes to one U+FFFD.
                        Some(len) => {
                            self.chars += 1;
                            rest = &after[len..];
                        }
                        // The start of a character: wait for the rest of it.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        at
    }
}

/// Adds one token to a completion choice's logprobs; `offset` follows the choice's text.
/// `skip_special`: control tokens add nothing to the text (they are still listed, by name).
pub fn push_completion(
    out: &mut CompletionLogprobs,
    tokenizer: &Tokenizer,
    skip_special: bool,
    lp: &TokenLogprobs,
    offset: &mut TextOffset,
) {
    let added: &[u8] = if skip_special && tokenizer.is_special(lp.token) {
        &[]
    } else {
        tokenizer.token_bytes(lp.token)
    };
    out.text_offset.push(offset.advance(added));
    // As vLLM: the alternatives, plus the chosen token when it is not among them. Keys are
    // unique per token id, so the map holds every alternative asked for.
    let mut top: HashMap<String, f32> = HashMap::with_capacity(lp.top.len() + 1);
    let mut chosen_key = None;
    for &(t, l) in &lp.top {
        let key = unique_key(tokenizer, t, &top);
        if t == lp.token {
            chosen_key = Some(key.clone());
        }
        top.insert(key, finite_logprob(l));
    }
    let chosen_key = chosen_key.unwrap_or_else(|| {
        let key = unique_key(tokenizer, lp.token, &top);
        top.insert(key.clone(), finite_logprob(lp.logprob));
        key
    });
    out.tokens.push(chosen_key);
    out.token_logprobs.push(finite_logprob(lp.logprob));
    out.top_logprobs.push(top);
}

/// A key for `token` in a `top_logprobs` map that no other token of the map has. Two ids can
/// stand for the same text (a byte-fallback token `<0x41>` and `A`, a control token and a
/// plain one of the same spelling); the later one is then shown by its bytes, and failing
/// that by its id, rather than overwrite the first.
fn unique_key(tokenizer: &Tokenizer, token: u32, taken: &HashMap<String, f32>) -> String {
    let text = token_text(tokenizer, token);
    if !taken.contains_key(&text) {
        return text;
    }
    let bytes = escaped_bytes(tokenizer.token_bytes(token));
    if !taken.contains_key(&bytes) {
        return bytes;
    }
    format!("token_id:{token}")
}

pub fn chat_entry(tokenizer: &Tokenizer, lp: &TokenLogprobs) -> ChatTokenLogprob {
    ChatTokenLogprob {
        token: token_text(tokenizer, lp.token),
        logprob: finite_logprob(lp.logprob),
        bytes: tokenizer.token_bytes(lp.token).to_vec(),
        top_logprobs: lp
            .top
            .iter()
            .map(|&(t, l)| ChatTopLogprob {
                token: token_text(tokenizer, t),
                logprob: finite_logprob(l),
                bytes: tokenizer.token_bytes(t).to_vec(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::testing::{tiny_tokenizer, TINY_IM_END};

    #[test]
    fn control_tokens_show_their_text_and_fragments_their_bytes() {
        let tok = tiny_tokenizer();
        assert_eq!(token_text(&tok, TINY_IM_END), "<|im_end|>");
        assert_eq!(token_text(&tok, u32::from(b'a')), "a");
        // The tiny vocabulary has one token per byte: 0xe2 alone is no character.
        assert_eq!(token_text(&tok, 0xe2), "bytes:\\xe2");
    }

    #[test]
    fn offsets_count_characters_of_the_decoded_text() {
        let mut o = TextOffset::after("ab");
        assert_eq!(o.advance(b"c"), 2);
        // "é" split over two tokens: it starts at the token that completes it.
        assert_eq!(o.advance(&[0xc3]), 3);
        assert_eq!(o.advance(&[0xa9]), 3);
        assert_eq!(o.advance(b""), 4);
        // An invalid byte is one replacement character.
        assert_eq!(o.advance(&[0xff, b'x']), 4);
        assert_eq!(o.advance(b"y"), 6);
    }

    #[test]
    fn top_logprobs_keep_every_alternative_and_the_chosen_token() {
        let tok = tiny_tokenizer();
        let lp = TokenLogprobs {
            token: TINY_IM_END,
            logprob: -0.5,
            top: vec![(TINY_IM_END, -0.5), (259, -1.0), (u32::from(b'a'), -2.0)],
        };
        let mut out = CompletionLogprobs::default();
        let mut offset = TextOffset::default();
        push_completion(&mut out, &tok, true, &lp, &mut offset);
        assert_eq!(out.tokens, ["<|im_end|>"]);
        assert_eq!(out.top_logprobs[0].len(), 3);
        assert_eq!(out.top_logprobs[0]["<|endoftext|>"], -1.0);
        // The skipped control token adds nothing to the text.
        assert_eq!(offset.advance(b""), 0);
        // Not among the alternatives: listed too.
        let lp = TokenLogprobs {
            token: u32::from(b'b'),
            logprob: -3.0,
            top: vec![(TINY_IM_END, -0.5)],
        };
        push_completion(&mut out, &tok, true, &lp, &mut offset);
        assert_eq!(out.top_logprobs[1].len(), 2);
        assert_eq!(out.top_logprobs[1]["b"], -3.0);
    }

    #[test]
    fn two_tokens_of_one_text_get_distinct_keys() {
        let tok = tiny_tokenizer();
        let mut taken = HashMap::new();
        taken.insert("a".to_string(), 0.0);
        assert_eq!(unique_key(&tok, u32::from(b'a'), &taken), "bytes:\\x61");
        taken.insert("bytes:\\x61".to_string(), 0.0);
        assert_eq!(unique_key(&tok, u32::from(b'a'), &taken), "token_id:97");
    }
}
