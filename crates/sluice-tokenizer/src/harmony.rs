//! gpt-oss's output, in OpenAI's Harmony format, read back into what the APIs return: the
//! `analysis` channel as reasoning, a message addressed to a function (`to=functions.NAME`,
//! the `commentary` channel) as a tool call, and `final` (and `commentary` addressed to no
//! one, a preamble the user is meant to see) as the answer.
//!
//! The generation prompt ends with `<|start|>assistant`, so the output opens with the first
//! message's header:
//!
//! ```text
//! <|channel|>analysis<|message|>Need the weather.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//! ```
//!
//! (one line in the output; `<|call|>` and `<|return|>` end generation, so they are not in the
//! text). The parser reads text, so the control tokens must be decoded, not skipped. It
//! streams: a body's text is given out as soon as it cannot be the start of `<|end|>`. Output
//! that breaks the format (no header where one must be, an unknown channel, a header that never
//! ends) is the model's own words: from there on everything, the held header included, is
//! content, so nothing is lost.

use crate::tool_event::ToolEvent;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
/// What ends a message's body: `<|end|>` between messages, `<|call|>` after a call and
/// `<|return|>` after the answer (the last two only show when generation ignores EOS).
const BODY_ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// The ways a header can open: the channel, a recipient before it, or (after `<|end|>`) the
/// next message's role.
const HEADER_OPENERS: [&str; 3] = [CHANNEL, " to=", START];
/// A header longer than this without `<|message|>` is not one.
const MAX_HEADER_BYTES: usize = 512;
/// The namespace the chat template declares the request's tools in.
const FUNCTIONS: &str = "functions.";

/// Splits one Harmony response into reasoning, content and tool calls as it is generated,
/// with the same events as [`ToolCallParser`](crate::ToolCallParser) plus
/// [`ToolEvent::Reasoning`]. Push the text as it is decoded, then call
/// [`finish`](Self::finish) once. Any chunking of the same text gives the same events once
/// merged.
#[derive(Debug, Clone)]
pub struct HarmonyParser {
    state: State,
    /// Text not yet given out: a header being read, or the end of a body that may begin a
    /// body end.
    pending: String,
    next_call: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a message's header, up to `<|message|>`.
    Header,
    /// In a message's body.
    Body(Body),
    /// The output broke the format: everything from here on is content.
    Plain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call(usize),
}

/// A header read: where its body goes.
fn read_header(header: &str) -> Option<Body> {
    let mut rest = header;
    if let Some(after) = rest.strip_prefix(START) {
        rest = after.strip_prefix("assistant")?;
    }
    let mut channel = None;
    let mut recipient = None;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if let Some(after) = rest.strip_prefix(CHANNEL) {
            let (word, after) = split_word(after);
            if channel.replace(word).is_some() || word.is_empty() {
                return None;
            }
            rest = after;
        } else if let Some(after) = rest.strip_prefix("to=") {
            let (word, after) = split_word(after);
            if recipient.replace(word).is_some() || word.is_empty() {
                return None;
            }
            rest = after;
        } else {
            // A content type, `<|constrain|>json` or a bare `json`: it says how the body is
            // written, which a call's arguments show anyway.
            let after = rest.strip_prefix(CONSTRAIN).unwrap_or(rest);
            let (word, after) = split_word(after);
            if word.is_empty() {
                return None;
            }
            rest = after;
        }
    }
    let channel = channel?;
    if !matches!(channel, "analysis" | "commentary" | "final") {
        return None;
    }
    Some(match (recipient, channel) {
        // A reply to the user is addressed to no one, or to `assistant` itself.
        (Some("assistant") | None, "analysis") => Body::Reasoning,
        (Some("assistant") | None, _) => Body::Content,
        (Some(_), _) => Body::Call(0),
    })
}

/// The word at the start of `text` (up to whitespace or a control token) and what follows.
fn split_word(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(text.len());
    text.split_at(end)
}

/// The recipient named in `header` (`functions.get_weather`), without the namespace of the
/// request's own tools.
fn call_name(header: &str) -> String {
    let at = header.find("to=").map_or(header.len(), |i| i + 3);
    let (recipient, _) = split_word(&header[at..]);
    recipient
        .strip_prefix(FUNCTIONS)
        .unwrap_or(recipient)
        .to_string()
}

/// Whether `text` could still grow into a header: it starts as one of the openers does.
fn could_be_header(text: &str) -> bool {
    HEADER_OPENERS
        .iter()
        .any(|opener| text.starts_with(opener) || opener.starts_with(text))
}

/// Where a body's text can be given out up to: before a trailing piece that could begin one
/// of the body ends.
fn body_hold_point(text: &str) -> usize {
    let held = BODY_ENDS
        .iter()
        .map(|end| {
            let longest = (end.len() - 1).min(text.len());
            (1..=longest)
                .rev()
                .find(|length| text.ends_with(&end[..*length]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    // The ends are ASCII, so a matching suffix starts on a character boundary.
    text.len() - held
}

impl Default for HarmonyParser {
    fn default() -> Self {
        Self::new()
    }
}

impl HarmonyParser {
    /// A parser for one response, whose text starts with its first message's header.
    pub fn new() -> Self {
        Self {
            state: State::Header,
            pending: String::new(),
            next_call: 0,
        }
    }

    /// Reads the next piece of generated text, appending what it completes to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        self.pending.push_str(text);
        loop {
            match self.state {
                State::Plain => {
                    let text = std::mem::take(&mut self.pending);
                    emit(out, Body::Content, &text);
                    return;
                }
                State::Header => {
                    if let Some(at) = self.pending.find(MESSAGE) {
                        let header = &self.pending[..at];
                        match read_header(header) {
                            Some(body) => {
                                let body = match body {
                                    Body::Call(_) => {
                                        let index = self.next_call;
                                        self.next_call += 1;
                                        out.push(ToolEvent::CallStart {
                                            index,
                                            name: call_name(header),
                                        });
                                        Body::Call(index)
                                    }
                                    other => other,
                                };
                                self.pending.drain(..at + MESSAGE.len());
                                self.state = State::Body(body);
                                continue;
                            }
                            None => {
                                self.state = State::Plain;
                                continue;
                            }
                        }
                    }
                    if !could_be_header(&self.pending) || self.pending.len() > MAX_HEADER_BYTES {
                        self.state = State::Plain;
                        continue;
                    }
                    return;
                }
                State::Body(body) => {
                    let end = BODY_ENDS
                        .iter()
                        .filter_map(|end| self.pending.find(end).map(|at| (at, end.len())))
                        .min();
                    if let Some((at, len)) = end {
                        let after = self.pending.split_off(at);
                        let text = std::mem::replace(&mut self.pending, after[len..].to_string());
                        emit(out, body, &text);
                        self.state = State::Header;
                        continue;
                    }
                    let held = self.pending.split_off(body_hold_point(&self.pending));
                    let text = std::mem::replace(&mut self.pending, held);
                    emit(out, body, &text);
                    return;
                }
            }
        }
    }

    /// Ends the response. A body cut off (token limit) keeps what it had, a held piece of a
    /// body end included; an unfinished header is content, as the model wrote it.
    pub fn finish(&mut self, out: &mut Vec<ToolEvent>) {
        let held = std::mem::take(&mut self.pending);
        match self.state {
            State::Body(body) => emit(out, body, &held),
            State::Header | State::Plain => emit(out, Body::Content, &held),
        }
    }
}

/// Appends `text` to `out` as `body`'s kind of event, into the last event when it continues it.
fn emit(out: &mut Vec<ToolEvent>, body: Body, text: &str) {
    if text.is_empty() {
        return;
    }
    match (out.last_mut(), body) {
        (Some(ToolEvent::Reasoning(last)), Body::Reasoning)
        | (Some(ToolEvent::Content(last)), Body::Content) => last.push_str(text),
        (Some(ToolEvent::CallArguments { index, fragment }), Body::Call(call))
            if *index == call =>
        {
            fragment.push_str(text)
        }
        (_, Body::Reasoning) => out.push(ToolEvent::Reasoning(text.to_string())),
        (_, Body::Content) => out.push(ToolEvent::Content(text.to_string())),
        (_, Body::Call(index)) => out.push(ToolEvent::CallArguments {
            index,
            fragment: text.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ToolEvent::{CallArguments, CallStart, Content, Reasoning};

    fn parse_chunks<'a>(chunks: impl IntoIterator<Item = &'a str>) -> Vec<ToolEvent> {
        let mut parser = HarmonyParser::new();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.push(chunk, &mut out);
        }
        parser.finish(&mut out);
        // `emit` joins neighbours within a call; join across calls too.
        let mut joined: Vec<ToolEvent> = Vec::new();
        for event in out {
            match (joined.last_mut(), event) {
                (Some(Reasoning(last)), Reasoning(text)) | (Some(Content(last)), Content(text)) => {
                    last.push_str(&text)
                }
                (
                    Some(CallArguments { index, fragment }),
                    CallArguments {
                        index: i,
                        fragment: f,
                    },
                ) if *index == i => fragment.push_str(&f),
                (_, event) => joined.push(event),
            }
        }
        joined
    }

    /// Parses `text` whole and checks that every split into two or three pieces, and one
    /// character at a time, gives the same events.
    fn parse(text: &str) -> Vec<ToolEvent> {
        let whole = parse_chunks([text]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(
            parse_chunks(chars.iter().map(String::as_str)),
            whole,
            "{text:?}"
        );
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
        for (n, &a) in bounds.iter().enumerate() {
            assert_eq!(parse_chunks([&text[..a], &text[a..]]), whole, "at {a}");
            for &b in bounds.iter().skip(n + 1).step_by(7) {
                let pieces = [&text[..a], &text[a..b], &text[b..]];
                assert_eq!(parse_chunks(pieces), whole, "at {a}, {b}");
            }
        }
        whole
    }

    fn call(index: usize, name: &str) -> ToolEvent {
        CallStart {
            index,
            name: name.into(),
        }
    }

    fn args(index: usize, fragment: &str) -> ToolEvent {
        CallArguments {
            index,
            fragment: fragment.into(),
        }
    }

    #[test]
    fn reasoning_then_answer() {
        assert_eq!(
            parse(
                "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|>\
                 <|start|>assistant<|channel|>final<|message|>2 + 2 = 4."
            ),
            vec![
                Reasoning("User asks 2+2. Simple.".into()),
                Content("2 + 2 = 4.".into())
            ]
        );
    }

    #[test]
    fn calls_with_the_recipient_in_the_channel_or_in_the_role() {
        assert_eq!(
            parse(
                "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
                 <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                 {\"location\":\"Tokyo\"}"
            ),
            vec![
                Reasoning("Need the weather.".into()),
                call(0, "get_weather"),
                args(0, "{\"location\":\"Tokyo\"}"),
            ]
        );
        assert_eq!(
            parse(" to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"x\"}"),
            vec![call(0, "lookup"), args(0, "{\"q\": \"x\"}")]
        );
    }

    #[test]
    fn a_preamble_is_content_and_later_calls_count_up() {
        assert_eq!(
            parse(
                "<|channel|>commentary<|message|>Checking both.<|end|>\
                 <|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json\
                 <|message|>{}<|end|><|start|>assistant<|channel|>commentary to=functions.b\
                 <|message|>{\"n\":1}"
            ),
            vec![
                Content("Checking both.".into()),
                call(0, "a"),
                args(0, "{}"),
                call(1, "b"),
                args(1, "{\"n\":1}"),
            ]
        );
    }

    #[test]
    fn a_body_keeps_its_text_exactly_and_a_cut_off_one_keeps_what_it_had() {
        assert_eq!(
            parse("<|channel|>analysis<|message|>  a < b, <|e\n"),
            vec![Reasoning("  a < b, <|e\n".into())]
        );
        assert_eq!(
            parse("<|channel|>analysis<|message|>thinking <|en"),
            vec![Reasoning("thinking <|en".into())]
        );
        assert_eq!(
            parse("<|channel|>final<|message|>done<|return|>"),
            vec![Content("done".into())]
        );
    }

    #[test]
    fn other_recipients_are_calls_by_their_full_name() {
        assert_eq!(
            parse("<|channel|>analysis to=browser.search<|message|>{\"query\":\"x\"}"),
            vec![call(0, "browser.search"), args(0, "{\"query\":\"x\"}")]
        );
        assert_eq!(
            parse("<|channel|>final to=assistant<|message|>Hi"),
            vec![Content("Hi".into())]
        );
    }

    #[test]
    fn output_that_breaks_the_format_is_content_from_there_on() {
        // No header at all.
        assert_eq!(
            parse("Hello there <|channel|>final"),
            vec![Content("Hello there <|channel|>final".into())]
        );
        // An unknown channel: its header is given back.
        assert_eq!(
            parse("<|channel|>secret<|message|>x<|end|>"),
            vec![Content("<|channel|>secret<|message|>x<|end|>".into())]
        );
        // Good reasoning, then text where the next header should be.
        assert_eq!(
            parse("<|channel|>analysis<|message|>ok<|end|>and then"),
            vec![Reasoning("ok".into()), Content("and then".into())]
        );
        // A header cut off.
        assert_eq!(
            parse("<|channel|>analysis<|end|>"),
            vec![Content("<|channel|>analysis<|end|>".into())]
        );
        // A role other than the assistant's.
        assert_eq!(
            parse("<|channel|>final<|message|>a<|end|><|start|>user<|message|>b"),
            vec![Content("a<|start|>user<|message|>b".into())]
        );
        // A header that never ends.
        let long = format!("<|channel|>{}", "x".repeat(MAX_HEADER_BYTES));
        assert_eq!(parse_chunks([long.as_str()]), vec![Content(long.clone())]);
    }

    #[test]
    fn nothing_generated_is_nothing() {
        assert_eq!(parse(""), vec![]);
        assert_eq!(parse("<|chan"), vec![Content("<|chan".into())]);
    }
}
