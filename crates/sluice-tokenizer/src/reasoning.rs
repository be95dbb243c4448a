//! Reasoning out of a model's text: models such as Qwen3 and DeepSeek-R1 think inside
//! `<think>...</think>` before they answer, and OpenAI-compatible servers return that part as
//! `reasoning_content` beside the answer's `content`. The splitter streams: text is given out
//! as soon as it cannot be part of a tag.

use crate::partial_marker::hold_point;

const OPENING_TAG: &str = "<think>";
const CLOSING_TAG: &str = "</think>";

/// A piece of the model's text, on one side of the split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningEvent {
    /// Text inside the `<think>` block.
    Reasoning(String),
    /// Text of the answer.
    Content(String),
}

/// Splits one response into reasoning and answer as it is generated. Push the text as it is
/// decoded, then call [`finish`](Self::finish) once at the end.
///
/// Only a `<think>` block at the very start of the response (whitespace aside) is reasoning,
/// and there is only one: after `</think>` everything is the answer, tags included. The tags
/// themselves never appear in either stream, and neither does the whitespace just inside them
/// or just after `</think>` (the models put line breaks there as layout). A response cut off
/// inside the block (token limit) is all reasoning.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    state: State,
    /// Text held back: a possible beginning of a tag, or whitespace that may precede one.
    pending: String,
    /// Whitespace at the start of the current side is layout: drop it.
    trim_leading: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace so far: `<think>` may still open the response.
    Start,
    Reasoning,
    Content,
}

impl ReasoningParser {
    /// A splitter for one response. `prompt_opened_thinking` says the prompt already ends
    /// inside `<think>` (see
    /// [`ChatTemplate::prompt_opens_thinking`](crate::ChatTemplate::prompt_opens_thinking)),
    /// so the response starts as reasoning without a tag of its own.
    pub fn new(prompt_opened_thinking: bool) -> Self {
        Self {
            state: if prompt_opened_thinking {
                State::Reasoning
            } else {
                State::Start
            },
            pending: String::new(),
            trim_leading: prompt_opened_thinking,
        }
    }

    /// Splits the next piece of generated text, appending what it completes to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<ReasoningEvent>) {
        self.pending.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let rest = self.pending.trim_start();
                    if let Some(after) = rest.strip_prefix(OPENING_TAG) {
                        self.pending = after.to_string();
                        self.state = State::Reasoning;
                        self.trim_leading = true;
                        continue;
                    }
                    if rest.is_empty() || OPENING_TAG.starts_with(rest) {
                        return;
                    }
                    self.state = State::Content;
                }
                State::Reasoning => {
                    if self.trim_leading {
                        self.drop_leading_whitespace();
                        if self.pending.is_empty() {
                            return;
                        }
                    }
                    if let Some(at) = self.pending.find(CLOSING_TAG) {
                        let after = self.pending[at + CLOSING_TAG.len()..].to_string();
                        self.pending.truncate(at);
                        let reasoning = std::mem::take(&mut self.pending);
                        emit(out, ReasoningEvent::Reasoning, reasoning.trim_end());
                        self.pending = after;
                        self.state = State::Content;
                        self.trim_leading = true;
                        continue;
                    }
                    let held_from = hold_point(&self.pending, CLOSING_TAG);
                    let held = self.pending.split_off(held_from);
                    let reasoning = std::mem::replace(&mut self.pending, held);
                    emit(out, ReasoningEvent::Reasoning, &reasoning);
                    return;
                }
                State::Content => {
                    if self.trim_leading {
                        self.drop_leading_whitespace();
                    }
                    let content = std::mem::take(&mut self.pending);
                    emit(out, ReasoningEvent::Content, &content);
                    return;
                }
            }
        }
    }

    /// Ends the response, giving out what was held back: on the side it was on (a `</thi` at
    /// the end of a cut-off block is reasoning text).
    pub fn finish(&mut self, out: &mut Vec<ReasoningEvent>) {
        let held = std::mem::take(&mut self.pending);
        match self.state {
            State::Start | State::Content => emit(out, ReasoningEvent::Content, &held),
            State::Reasoning => emit(out, ReasoningEvent::Reasoning, held.trim_end()),
        }
    }

    fn drop_leading_whitespace(&mut self) {
        let kept_from = self.pending.len() - self.pending.trim_start().len();
        self.pending.drain(..kept_from);
        if !self.pending.is_empty() {
            self.trim_leading = false;
        }
    }
}

/// Appends `text` to `out`, into the last event when it is of the same kind.
fn emit(out: &mut Vec<ReasoningEvent>, kind: fn(String) -> ReasoningEvent, text: &str) {
    if text.is_empty() {
        return;
    }
    let same_kind = matches!(
        (out.last(), kind(String::new())),
        (
            Some(ReasoningEvent::Reasoning(_)),
            ReasoningEvent::Reasoning(_)
        ) | (Some(ReasoningEvent::Content(_)), ReasoningEvent::Content(_))
    );
    match out.last_mut() {
        Some(ReasoningEvent::Reasoning(last) | ReasoningEvent::Content(last)) if same_kind => {
            last.push_str(text)
        }
        _ => out.push(kind(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReasoningEvent::{Content, Reasoning};

    fn split_chunks<'a>(
        opened: bool,
        chunks: impl IntoIterator<Item = &'a str>,
    ) -> Vec<ReasoningEvent> {
        let mut parser = ReasoningParser::new(opened);
        let mut out = Vec::new();
        for chunk in chunks {
            parser.push(chunk, &mut out);
        }
        parser.finish(&mut out);
        // `emit` already joins neighbours within a call; join across calls too.
        let mut joined: Vec<ReasoningEvent> = Vec::new();
        for event in out {
            match (joined.last_mut(), event) {
                (Some(Reasoning(last)), Reasoning(text)) | (Some(Content(last)), Content(text)) => {
                    last.push_str(&text)
                }
                (_, event) => joined.push(event),
            }
        }
        joined
    }

    /// Splits `text` whole and checks that every chunking gives the same result.
    fn split(opened: bool, text: &str) -> Vec<ReasoningEvent> {
        let whole = split_chunks(opened, [text]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(
            split_chunks(opened, chars.iter().map(String::as_str)),
            whole,
            "{text:?}"
        );
        for (at, _) in text.char_indices().skip(1) {
            assert_eq!(
                split_chunks(opened, [&text[..at], &text[at..]]),
                whole,
                "at {at}: {text:?}"
            );
            for (second, _) in text[at..].char_indices().skip(1) {
                let second = at + second;
                let chunks = [&text[..at], &text[at..second], &text[second..]];
                assert_eq!(
                    split_chunks(opened, chunks),
                    whole,
                    "at {at},{second}: {text:?}"
                );
            }
        }
        whole
    }

    fn reasoning(text: &str) -> ReasoningEvent {
        Reasoning(text.to_string())
    }

    fn content(text: &str) -> ReasoningEvent {
        Content(text.to_string())
    }

    #[test]
    fn think_block_is_reasoning_and_the_rest_content() {
        assert_eq!(
            split(
                false,
                "<think>\nHmm, 2 < 3 </thin k>.\n</think>\n\nIt is 5 <think> é."
            ),
            vec![
                reasoning("Hmm, 2 < 3 </thin k>."),
                content("It is 5 <think> é.")
            ]
        );
        assert_eq!(
            split(false, "\n <think>a</think>b"),
            vec![reasoning("a"), content("b")]
        );
    }

    #[test]
    fn without_a_leading_think_everything_is_content() {
        assert_eq!(
            split(false, "Hi <think>x</think>"),
            vec![content("Hi <think>x</think>")]
        );
        assert_eq!(split(false, "<thin"), vec![content("<thin")]);
        assert_eq!(split(false, "  \n"), vec![content("  \n")]);
    }

    #[test]
    fn prompt_opened_think_starts_in_reasoning() {
        assert_eq!(
            split(true, "\nstep 1\n</think>\n\nDone"),
            vec![reasoning("step 1"), content("Done")]
        );
        // Cut off inside the block: all reasoning, partial tag included.
        assert_eq!(
            split(true, "step 1\n</thi"),
            vec![reasoning("step 1\n</thi")]
        );
        assert_eq!(split(true, "a</think>"), vec![reasoning("a")]);
    }

    #[test]
    fn reasoning_streams_until_it_could_be_the_closing_tag() {
        let mut parser = ReasoningParser::new(false);
        let mut out = Vec::new();
        parser.push("<think>I think </th", &mut out);
        assert_eq!(out, vec![reasoning("I think")]);
        out.clear();
        parser.push("ink>Yes", &mut out);
        assert_eq!(out, vec![content("Yes")]);
    }
}
