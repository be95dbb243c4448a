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
