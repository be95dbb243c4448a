//! The engine's per-token log-probabilities in the two shapes OpenAI uses: the completions
//! API's parallel lists and the chat API's list of token objects.

use std::collections::HashMap;

use sluice_engine::TokenLogprobs;
use sluice_tokenizer::Tokenizer;

use crate::openai::chat::{ChatTokenLogprob, ChatTopLogprob};
use crate::openai::common::finite_logprob;
use crate::openai::completions::CompletionLogprobs;

/// The bytes a token adds to the output: none for a control token (`<|im_end|>`) when those are
/// skipped, so the tokens of a choice's logprobs concatenate to its text, as in OpenAI's API.
fn token_bytes(tokenizer: &Tokenizer, token: u32, skip_special: bool) -> &[u8] {
    if skip_special && tokenizer.is_special(token) {
        &[]
    } else {
        tokenizer.token_bytes(token)
    }
}

/// A token's text as clients see it in logprobs: its bytes, with a fragment of a multi-byte
/// character shown as U+FFFD (the `bytes` field of the chat shape keeps the exact bytes).
pub fn token_text(tokenizer: &Tokenizer, token: u32, skip_special: bool) -> String {
    String::from_utf8_lossy(token_bytes(tokenizer, token, skip_special)).into_owned()
}

/// Adds one token to a completion choice's logprobs. `offset` is the character offset in the
/// choice's text where this token's text starts; it is advanced past it.
pub fn push_completion(
    out: &mut CompletionLogprobs,
    tokenizer: &Tokenizer,
    skip_special: bool,
    lp: &TokenLogprobs,
    offset: &mut usize,
) {
    let text = token_text(tokenizer, lp.token, skip_special);
    out.text_offset.push(*offset);
    *offset += text.chars().count();
    // As vLLM: the alternatives, plus the chosen token when it is not among them.
    let mut top: HashMap<String, f32> = lp
        .top
        .iter()
        .map(|&(t, l)| (token_text(tokenizer, t, skip_special), finite_logprob(l)))
        .collect();
    top.entry(text.clone())
        .or_insert_with(|| finite_logprob(lp.logprob));
    out.tokens.push(text);
    out.token_logprobs.push(finite_logprob(lp.logprob));
    out.top_logprobs.push(top);
}

pub fn chat_entry(
    tokenizer: &Tokenizer,
    skip_special: bool,
    lp: &TokenLogprobs,
) -> ChatTokenLogprob {
    let bytes = token_bytes(tokenizer, lp.token, skip_special).to_vec();
    ChatTokenLogprob {
        token: String::from_utf8_lossy(&bytes).into_owned(),
        logprob: finite_logprob(lp.logprob),
        bytes,
        top_logprobs: lp
            .top
            .iter()
            .map(|&(t, l)| {
                let bytes = token_bytes(tokenizer, t, skip_special).to_vec();
                ChatTopLogprob {
                    token: String::from_utf8_lossy(&bytes).into_owned(),
                    logprob: finite_logprob(l),
                    bytes,
                }
            })
            .collect(),
    }
}
