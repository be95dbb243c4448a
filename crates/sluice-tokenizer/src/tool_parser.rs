//! Tool calls out of a model's text: which format a model writes its calls in, and an
//! incremental parser that splits generated text into plain content and calls as it streams.
//! The grammars that force a model to write a valid call are `sluice-engine`'s, with every
//! other grammar (`grammar::tool_calls`).
//!
//! The parser streams: content is given out as soon as it cannot be the start of a call, a
//! call's name as soon as it is complete, and its arguments as they arrive, so a streaming
//! client sees the same deltas OpenAI sends. Any chunking of the same text gives the same
//! events once merged.

use std::sync::Arc;

use crate::bare_call::BareCallScanner;
use crate::harmony::HarmonyParser;
use crate::json_scan::{NestingScanner, StringLiteral};
use crate::partial_marker::hold_point;
pub use crate::tool_event::ToolEvent;

/// How a model family writes tool calls in its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    /// Hermes, Qwen 2.5/3: `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one
    /// block per call.
    Hermes,
    /// Llama 3.1-3.3 JSON calls: an optional `<|python_tag|>`, then
    /// `{"name": "f", "parameters": {...}}` (or `"arguments"`), several separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` and a JSON array of `{"name": ..., "arguments": {...}}`, or the
    /// newer `[TOOL_CALLS]f[ARGS]{...}` per call.
    Mistral,
    /// gpt-oss's Harmony: a message on the `commentary` channel addressed to
    /// `functions.NAME`, its body the arguments; reasoning and answer have channels of their
    /// own ([`HarmonyParser`](crate::harmony::HarmonyParser)). vLLM calls it `openai`.
    Harmony,
}

impl ToolCallFormat {
    /// Every format, in the order of [`ToolCallFormat::NAMES`].
    pub const ALL: [ToolCallFormat; 4] =
        [Self::Hermes, Self::Llama3Json, Self::Mistral, Self::Harmony];

    /// The names [`from_name`](Self::from_name) accepts (vLLM's parser names), for help and
    /// error messages.
    pub const NAMES: [&'static str; 4] = ["hermes", "llama3_json", "mistral", "openai"];

    /// The format called `name` (`"hermes"`, `"llama3_json"`, `"mistral"`, `"openai"`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|format| format.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::Harmony => "openai",
        }
    }

    /// The format a chat template teaches its model, read from the markup the template prints
    /// around tools: Harmony's `<|channel|>` (gpt-oss), `<tool_call>` (Hermes), `[TOOL_CALLS]`
    /// (Mistral), `<|python_tag|>` or an `ipython` role with JSON function-call instructions
    /// (Llama 3). `None` when the template shows none of them.
    pub fn detect(template_source: &str) -> Option<Self> {
        if template_source.contains("<|channel|>") {
            return Some(Self::Harmony);
        }
        if template_source.contains("<tool_call>") {
            return Some(Self::Hermes);
        }
        if template_source.contains("[TOOL_CALLS]") {
            return Some(Self::Mistral);
        }
        let llama_json_wording = [
            "\"parameters\"",
            "JSON for a function call",
            "function call",
        ]
        .iter()
        .any(|wording| template_source.contains(wording));
        if template_source.contains("<|python_tag|>")
            || (template_source.contains("ipython") && llama_json_wording)
        {
            return Some(Self::Llama3Json);
        }
        None
    }

    /// A parser for one response in this format.
    pub fn parser(self) -> ToolCallParser {
        ToolCallParser::new(self)
    }

    /// The markup parser of a format written as text around JSON; `None` for Harmony.
    fn markup(self) -> Option<Markup> {
        match self {
            Self::Hermes => Some(Markup::Hermes),
            Self::Llama3Json => Some(Markup::Llama3Json),
            Self::Mistral => Some(Markup::Mistral),
            Self::Harmony => None,
        }
    }
}

/// The formats whose calls are JSON inside markup, read by [`MarkupParser`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Markup {
    Hermes,
    Llama3Json,
    Mistral,
}

impl Markup {
    /// The text that opens a call: content stops where it appears.
    fn opening_marker(self) -> &'static str {
        match self {
            Self::Hermes => "<tool_call>",
            Self::Llama3Json => "<|python_tag|>",
            Self::Mistral => "[TOOL_CALLS]",
        }
    }

    /// A character that opens a call when it is the first thing the model writes (or the
    /// first after a call): Llama 3 often writes its JSON bare, and Mistral's `[TOOL_CALLS]` is
    /// a control token that decoding with `skip_special_tokens` removes, leaving the array.
    fn bare_opener(self) -> Option<char> {
        match self {
            Self::Hermes => None,
            Self::Llama3Json => Some('{'),
            Self::Mistral => Some('['),
        }
    }
}

impl std::str::FromStr for ToolCallFormat {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::from_name(name).ok_or_else(|| {
            format!(
                "`{name}` is not a tool-call format; use one of {}",
                Self::NAMES.join(", ")
            )
        })
    }
}

impl std::fmt::Display for ToolCallFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Splits one response's text into content and tool calls as it is generated. Push the text as
/// it is decoded, then call [`finish`](Self::finish) once at the end.
///
/// Call text never reaches [`ToolEvent::Content`], and content is held back only while it
/// could still be the start of a call (a trailing `<tool_` say, or whitespace that may turn
/// out to be a separator before a call). Whitespace directly before a call, between calls and
/// after the last call is dropped; other text after a call is content.
///
/// A call that turns out malformed before its name was given out (no JSON object after the
/// marker, no name, the output ends first) is given back as content, markup included: those
/// are the model's own words. Once [`ToolEvent::CallStart`] is out the call is never taken
/// back: if the text then breaks off (the output is cut at its token limit) or stops making
/// sense, the arguments given out so far stay as they are, possibly incomplete JSON, and the
/// rest of that call's text is dropped (for Hermes, up to `</tool_call>`; for the other
/// formats, parsing goes back to content at the first character that cannot belong to it).
///
/// Harmony is read by [`HarmonyParser`], with its own rules for output that breaks the format.
///
/// [`ToolCallParser::with_bare_calls`] also reads an answer that is a call's JSON alone,
/// without the format's markup ([`crate::bare_call`]).
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    reader: Reader,
    /// While the answer may still be a bare call: its text, held.
    bare: Option<BareCallScanner>,
}

#[derive(Debug, Clone)]
enum Reader {
    Markup(Box<MarkupParser>),
    Harmony(HarmonyParser),
}

impl ToolCallParser {
    /// A parser for one response in `format` (the same as [`ToolCallFormat::parser`]).
    pub fn new(format: ToolCallFormat) -> Self {
        let reader = match format.markup() {
            Some(markup) => Reader::Markup(Box::new(MarkupParser::new(markup))),
            None => Reader::Harmony(HarmonyParser::new()),
        };
        Self { reader, bare: None }
    }

    /// Also reads a whole answer that is exactly a call's JSON object, or an array of them,
    /// without the format's markup, as those calls, when each names one of `offered` and has
    /// an object of arguments (`{"name": ..., "arguments": {...}}`). Such an answer is held back
    /// while it can still be one. Harmony marks every message with its channel, so it reads
    /// no bare calls; Llama 3's bare `{` and Mistral's bare `[` are already its format's own.
    pub fn with_bare_calls(mut self, offered: Arc<[String]>) -> Self {
        if let Reader::Markup(parser) = &self.reader {
            self.bare = Some(BareCallScanner::new(offered, parser.format.bare_opener()));
        }
        self
    }

    /// Parses the next piece of generated text, appending what it completes to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if let Some(bare) = &mut self.bare {
            if bare.feed(text) {
                return;
            }
            // Not a bare call: what was held is read as the format reads any text.
            let held = self.bare.take().map(BareCallScanner::into_held);
            self.read(held.as_deref().unwrap_or_default(), out);
            return;
        }
        self.read(text, out);
    }

    /// Ends the response: held-back text and a call that never started come out as content.
    /// A call that started stays as it is (see the type's documentation).
    pub fn finish(&mut self, out: &mut Vec<ToolEvent>) {
        if let Some(bare) = self.bare.take() {
            match bare.finish() {
                Ok(calls) => {
                    out.extend(calls);
                    return;
                }
                Err(held) => self.read(&held, out),
            }
        }
        match &mut self.reader {
            Reader::Markup(parser) => parser.finish(out),
            Reader::Harmony(parser) => parser.finish(out),
        }
    }

    fn read(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        match &mut self.reader {
            Reader::Markup(parser) => parser.push(text, out),
            Reader::Harmony(parser) => parser.push(text, out),
        }
    }
}

/// The parser of the formats that write calls as JSON in markup.
#[derive(Debug, Clone)]
struct MarkupParser {
    format: Markup,
    state: State,
    /// Text pushed and not yet dealt with: in content, what is held back.
    pending: String,
    /// The current call's text since its marker, while it has not started: given back as
    /// content if it turns out not to be a call.
    raw: String,
    /// Index the next call will have.
    next_index: usize,
    /// A call ended and no content came since: whitespace here separates, and is dropped.
    after_call: bool,
    /// Only whitespace since the start or the last call: a bare opener may start a call.
    at_boundary: bool,
    /// A call is open whose name has not been given out: its text is kept in `raw`.
    unstarted: bool,
    /// The open call began with a bare opener, not a marker: its first object must look like
    /// a call.
    bare_opening: bool,
}

#[derive(Debug, Clone)]
enum State {
    /// Plain content.
    Text,
    /// After an opening marker (or `,`/`;` between calls), before the call object's `{`.
    BeforeObject(Container),
    /// Mistral, after `[TOOL_CALLS]`: an array, an object, or the `name[ARGS]` form.
    MistralAfterMarker,
    /// Mistral's `name[ARGS]` form, reading the name.
    MistralName(String),
    /// Mistral's `name[ARGS]` form, after `[ARGS]`: the arguments object alone.
    BareArguments(Option<NestingScanner>),
    /// Inside the call object.
    Object(Box<CallObject>, Container),
    /// After a call object, looking for what comes next in its container.
    AfterObject(Container),
    /// Hermes: skipping to `</tool_call>`.
    SkipToClosingTag(String),
}

/// What holds the call objects, which decides what may follow one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    /// `<tool_call>` ... `</tool_call>`.
    HermesTags,
    /// Llama 3: objects separated by `;`.
    Semicolons,
    /// Mistral's `[...]` array.
    Array,
    /// One object and nothing after it (Mistral's `[TOOL_CALLS]{...}`).
    Single,
}

/// The state of one call object being read.
#[derive(Debug, Clone)]
struct CallObject {
    phase: Phase,
    name: Option<String>,
    /// Arguments read before the name, given out when it arrives.
    early_arguments: Option<String>,
    arguments_given: bool,
    /// The object opened without a marker: it is a call only if its first key is one.
    bare: bool,
    keys_seen: usize,
}

#[derive(Debug, Clone)]
enum Phase {
    /// After `{` or `,`: a key or `}`.
    KeyOrEnd,
    Key(StringLiteral),
    Colon(Key),
    ValueStart(Key),
    Name(StringLiteral),
    ArgumentsObject(NestingScanner),
    ArgumentsString(StringLiteral),
    /// A value we do not use (`"id": ...`), skipped: a string, a nested value, or a scalar.
    OtherString(StringLiteral),
    OtherNested(NestingScanner),
    OtherScalar,
    /// After a value: `,` or `}`.
    AfterValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Name,
    Arguments,
    Other,
}

/// What became of one character fed to a call state.
enum Fed {
    Consumed,
    /// The state changed without taking the character; feed it again.
    Again,
}

impl MarkupParser {
    fn new(format: Markup) -> Self {
        Self {
            format,
            state: State::Text,
            pending: String::new(),
            raw: String::new(),
            next_index: 0,
            after_call: false,
            at_boundary: true,
            unstarted: false,
            bare_opening: false,
        }
    }

    fn push(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        self.pending.push_str(text);
        let pending = std::mem::take(&mut self.pending);
        let mut consumed = 0;
        while consumed < pending.len() {
            if let State::Text = self.state {
                let (taken, waiting) = self.scan_text(&pending[consumed..], out);
                consumed += taken;
                if waiting {
                    break;
                }
                continue;
            }
            let c = pending[consumed..]
                .chars()
                .next()
                .expect("consumed stops on a character boundary");
            if let Fed::Consumed = self.feed_call(c, out) {
                consumed += c.len_utf8();
                if self.unstarted {
                    self.raw.push(c);
                }
            }
        }
        self.pending = pending[consumed..].to_string();
    }

    fn finish(&mut self, out: &mut Vec<ToolEvent>) {
        let held = std::mem::take(&mut self.pending);
        if self.unstarted {
            self.not_a_call(out);
        }
        if let State::Text = self.state {
            self.emit_content(&held, out);
        }
        self.state = State::Text;
    }

    /// Content: finds the next call opening in `text`, gives out the content before it and
    /// enters the call. Returns the bytes taken and whether it is waiting for more text (no
    /// opening found; the possible start of one is held back).
    fn scan_text(&mut self, text: &str, out: &mut Vec<ToolEvent>) -> (usize, bool) {
        let marker = self.format.opening_marker();
        let mut opening: Option<(usize, usize)> = text.find(marker).map(|at| (at, marker.len()));
        if let (true, Some(opener)) = (self.at_boundary, self.format.bare_opener()) {
            if let Some((at, c)) = text.char_indices().find(|(_, c)| !c.is_whitespace()) {
                let rest = &text[at..];
                let could_be_marker = marker.starts_with(rest) && rest.len() < marker.len();
                if c == opener && !rest.starts_with(marker) && !could_be_marker {
                    opening = Some((at, opener.len_utf8()));
                }
            }
        }
        let Some((at, length)) = opening else {
            let held_from = hold_point(text, marker);
            self.emit_content(&text[..held_from], out);
            return (held_from, true);
        };
        // Whitespace before a call only separates it from the content.
        self.emit_content(text[..at].trim_end(), out);
        let opened = &text[at..at + length];
        self.raw = opened.to_string();
        self.unstarted = true;
        self.bare_opening = opened != marker;
        self.state = match (opened == marker, self.format) {
            (true, Markup::Hermes) => State::BeforeObject(Container::HermesTags),
            (true, Markup::Llama3Json) => State::BeforeObject(Container::Semicolons),
            (true, Markup::Mistral) => State::MistralAfterMarker,
            (false, Markup::Mistral) => State::BeforeObject(Container::Array),
            (false, _) => State::Object(Box::new(CallObject::new(true)), Container::Semicolons),
        };
        (at + length, false)
    }

    /// Feeds one character of call text to the current state.
    fn feed_call(&mut self, c: char, out: &mut Vec<ToolEvent>) -> Fed {
        let state = std::mem::replace(&mut self.state, State::Text);
        let (next, fed) = match state {
            State::Text => unreachable!("content is scanned, not fed"),
            State::BeforeObject(container) => {
                if c.is_whitespace() {
                    (State::BeforeObject(container), Fed::Consumed)
                } else if c == '{' {
                    // After a bare `[`, the object must look like a call; after a marker the
                    // model said it is calling.
                    let object = CallObject::new(self.bare_opening);
                    (State::Object(Box::new(object), container), Fed::Consumed)
                } else {
                    return self.not_a_call(out);
                }
            }
            State::MistralAfterMarker => match c {
                c if c.is_whitespace() => (State::MistralAfterMarker, Fed::Consumed),
                '[' => (State::BeforeObject(Container::Array), Fed::Consumed),
                '{' => (
                    State::Object(Box::new(CallObject::new(false)), Container::Single),
                    Fed::Consumed,
                ),
                c if is_function_name_char(c) => (State::MistralName(c.to_string()), Fed::Consumed),
                _ => return self.not_a_call(out),
            },
            State::MistralName(mut text) => {
                text.push(c);
                if let Some(name_and_id) = text.strip_suffix("[ARGS]") {
                    // Newer Mistral templates put `[CALL_ID]id` between the name and
                    // `[ARGS]`.
                    let name = name_and_id
                        .split_once("[CALL_ID]")
                        .map_or(name_and_id, |(name, _)| name);
                    self.start_call(name.to_string(), out);
                    (State::BareArguments(None), Fed::Consumed)
                } else if c == '\n' || text.len() > MAX_MARKUP_NAME_BYTES {
                    // `c` was not kept in `raw` yet: it is read again as content.
                    return self.not_a_call(out);
                } else {
                    (State::MistralName(text), Fed::Consumed)
                }
            }
            State::BareArguments(None) => {
                if c.is_whitespace() {
                    (State::BareArguments(None), Fed::Consumed)
                } else if c == '{' {
                    let mut scanner = NestingScanner::default();
                    scanner.feed(c);
                    self.emit_arguments(&c.to_string(), out);
                    (State::BareArguments(Some(scanner)), Fed::Consumed)
                } else {
                    // No arguments object: the call has none.
                    self.emit_arguments("{}", out);
                    self.end_call();
                    (State::Text, Fed::Again)
                }
            }
            State::BareArguments(Some(mut scanner)) => {
                self.emit_arguments(&c.to_string(), out);
                if scanner.feed(c) {
                    self.end_call();
                    (State::Text, Fed::Consumed)
                } else {
                    (State::BareArguments(Some(scanner)), Fed::Consumed)
                }
            }
            State::Object(mut object, container) => {
                match self.feed_object(&mut object, c, out) {
                    ObjectStep::Continue(fed) => (State::Object(object, container), fed),
                    ObjectStep::Closed => {
                        if object.name.is_none() {
                            // A complete object without a name: the `}` is content too.
                            self.raw.push(c);
                            self.not_a_call(out);
                            return Fed::Consumed;
                        }
                        if !object.arguments_given {
                            self.emit_arguments("{}", out);
                        }
                        self.end_call();
                        let next = match container {
                            Container::Single => State::Text,
                            container => State::AfterObject(container),
                        };
                        (next, Fed::Consumed)
                    }
                    ObjectStep::NotACall => return self.not_a_call(out),
                    ObjectStep::Broken => {
                        self.end_call();
                        match container {
                            Container::HermesTags => {
                                (State::SkipToClosingTag(String::new()), Fed::Again)
                            }
                            _ => (State::Text, Fed::Again),
                        }
                    }
                }
            }
            State::AfterObject(container) => match (container, c) {
                (_, c) if c.is_whitespace() => (State::AfterObject(container), Fed::Consumed),
                (Container::HermesTags, _) => (State::SkipToClosingTag(String::new()), Fed::Again),
                (Container::Semicolons, ';') | (Container::Array, ',') => {
                    // Another call follows; `c` opens its text.
                    self.unstarted = true;
                    (State::BeforeObject(container), Fed::Consumed)
                }
                (Container::Array, ']') => (State::Text, Fed::Consumed),
                _ => (State::Text, Fed::Again),
            },
            State::SkipToClosingTag(mut tail) => {
                tail.push(c);
                if tail.ends_with(HERMES_CLOSING_TAG) {
                    (State::Text, Fed::Consumed)
                } else {
                    if tail.len() > HERMES_CLOSING_TAG.len() {
                        let keep_from = tail.len() - HERMES_CLOSING_TAG.len();
                        let keep_from = (keep_from..tail.len())
                            .find(|at| tail.is_char_boundary(*at))
                            .unwrap_or(tail.len());
                        tail.drain(..keep_from);
                    }
                    (State::SkipToClosingTag(tail), Fed::Consumed)
                }
            }
        };
        self.state = next;
        fed
    }

    /// One character inside a call object.
    fn feed_object(
        &mut self,
        object: &mut CallObject,
        c: char,
        out: &mut Vec<ToolEvent>,
    ) -> ObjectStep {
        let phase = std::mem::replace(&mut object.phase, Phase::AfterValue);
        object.phase = match phase {
            Phase::KeyOrEnd => match c {
                c if c.is_whitespace() => Phase::KeyOrEnd,
                '"' => {
                    let mut key = StringLiteral::default();
                    key.feed(c);
                    Phase::Key(key)
                }
                '}' => return ObjectStep::Closed,
                _ => return object.broken(),
            },
            Phase::Key(mut literal) => {
                if !literal.feed(c) {
                    object.phase = Phase::Key(literal);
                    return ObjectStep::Continue(Fed::Consumed);
                }
                let key = match literal.decode().as_deref() {
                    Some("name") if object.name.is_none() => Key::Name,
                    Some("arguments" | "parameters")
                        if !object.arguments_given && object.early_arguments.is_none() =>
                    {
                        Key::Arguments
                    }
                    _ => Key::Other,
                };
                object.keys_seen += 1;
                if object.bare && object.keys_seen == 1 && key == Key::Other {
                    return ObjectStep::NotACall;
                }
                Phase::Colon(key)
            }
            Phase::Colon(key) => match c {
                c if c.is_whitespace() => Phase::Colon(key),
                ':' => Phase::ValueStart(key),
                _ => return object.broken(),
            },
            Phase::ValueStart(key) => match (key, c) {
                (_, c) if c.is_whitespace() => Phase::ValueStart(key),
                (Key::Name, '"') => {
                    let mut literal = StringLiteral::default();
                    literal.feed(c);
                    Phase::Name(literal)
                }
                (Key::Name, _) => return object.broken(),
                (Key::Arguments, '{') => {
                    let mut scanner = NestingScanner::default();
                    scanner.feed(c);
                    self.arguments_text(object, c, out);
                    Phase::ArgumentsObject(scanner)
                }
                (Key::Arguments, '"') => {
                    let mut literal = StringLiteral::default();
                    literal.feed(c);
                    Phase::ArgumentsString(literal)
                }
                (_, '"') => {
                    let mut literal = StringLiteral::default();
                    literal.feed(c);
                    Phase::OtherString(literal)
                }
                (_, '{' | '[') => {
                    let mut scanner = NestingScanner::default();
                    scanner.feed(c);
                    Phase::OtherNested(scanner)
                }
                (_, ',' | '}' | ']' | ':') => return object.broken(),
                _ => Phase::OtherScalar,
            },
            Phase::Name(mut literal) => {
                if !literal.feed(c) {
                    object.phase = Phase::Name(literal);
                    return ObjectStep::Continue(Fed::Consumed);
                }
                let Some(name) = literal.decode() else {
                    return object.broken();
                };
                object.name = Some(name.clone());
                self.start_call(name, out);
                if let Some(arguments) = object.early_arguments.take() {
                    self.emit_arguments(&arguments, out);
                    object.arguments_given = true;
                }
                Phase::AfterValue
            }
            Phase::ArgumentsObject(mut scanner) => {
                self.arguments_text(object, c, out);
                if scanner.feed(c) {
                    if object.name.is_some() {
                        object.arguments_given = true;
                    }
                    Phase::AfterValue
                } else {
                    Phase::ArgumentsObject(scanner)
                }
            }
            Phase::ArgumentsString(mut literal) => {
                if !literal.feed(c) {
                    object.phase = Phase::ArgumentsString(literal);
                    return ObjectStep::Continue(Fed::Consumed);
                }
                let Some(inner) = literal.decode() else {
                    return object.broken();
                };
                // A string holding the JSON object: the object's text is the arguments.
                let arguments = if inner.trim().is_empty() {
                    "{}".to_string()
                } else {
                    inner
                };
                if object.name.is_some() {
                    self.emit_arguments(&arguments, out);
                    object.arguments_given = true;
                } else {
                    object.early_arguments = Some(arguments);
                }
                Phase::AfterValue
            }
            Phase::OtherString(mut literal) => {
                if literal.feed(c) {
                    Phase::AfterValue
                } else {
                    Phase::OtherString(literal)
                }
            }
            Phase::OtherNested(mut scanner) => {
                if scanner.feed(c) {
                    Phase::AfterValue
                } else {
                    Phase::OtherNested(scanner)
                }
            }
            Phase::OtherScalar => match c {
                ',' | '}' => {
                    object.phase = Phase::AfterValue;
                    return ObjectStep::Continue(Fed::Again);
                }
                c if c.is_whitespace() => Phase::AfterValue,
                _ => Phase::OtherScalar,
            },
            Phase::AfterValue => match c {
                c if c.is_whitespace() => Phase::AfterValue,
                ',' => Phase::KeyOrEnd,
                '}' => return ObjectStep::Closed,
                _ => return object.broken(),
            },
        };
        ObjectStep::Continue(Fed::Consumed)
    }

    /// One character of an arguments object: given out when the call has started, else kept
    /// until the name arrives.
    fn arguments_text(&mut self, object: &mut CallObject, c: char, out: &mut Vec<ToolEvent>) {
        if object.name.is_some() {
            self.emit_arguments(&c.to_string(), out);
        } else {
            object
                .early_arguments
                .get_or_insert_with(String::new)
                .push(c);
        }
    }

    /// The open call is not one after all (it had not started): its text so far is content,
    /// and the character that showed it is read again as content.
    fn not_a_call(&mut self, out: &mut Vec<ToolEvent>) -> Fed {
        let raw = std::mem::take(&mut self.raw);
        self.unstarted = false;
        self.bare_opening = false;
        self.state = State::Text;
        self.emit_content(&raw, out);
        Fed::Again
    }

    fn start_call(&mut self, name: String, out: &mut Vec<ToolEvent>) {
        self.raw.clear();
        self.unstarted = false;
        self.bare_opening = false;
        out.push(ToolEvent::CallStart {
            index: self.next_index,
            name,
        });
    }

    fn end_call(&mut self) {
        self.next_index += 1;
        self.raw.clear();
        self.unstarted = false;
        self.after_call = true;
        self.at_boundary = true;
    }

    fn emit_arguments(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        let index = self.next_index;
        if let Some(ToolEvent::CallArguments {
            index: last_index,
            fragment,
        }) = out.last_mut()
        {
            if *last_index == index {
                fragment.push_str(text);
                return;
            }
        }
        out.push(ToolEvent::CallArguments {
            index,
            fragment: text.to_string(),
        });
    }

    fn emit_content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        let text = if self.after_call {
            text.trim_start()
        } else {
            text
        };
        if text.is_empty() {
            return;
        }
        if !text.trim().is_empty() {
            self.after_call = false;
            self.at_boundary = false;
        }
        if let Some(ToolEvent::Content(last)) = out.last_mut() {
            last.push_str(text);
        } else {
            out.push(ToolEvent::Content(text.to_string()));
        }
    }
}

const HERMES_CLOSING_TAG: &str = "</tool_call>";

/// Longest function name read in Mistral's `name[ARGS]` form before deciding it is no call.
const MAX_MARKUP_NAME_BYTES: usize = 256;

fn is_function_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

enum ObjectStep {
    Continue(Fed),
    /// The object's closing `}`.
    Closed,
    /// A bare object whose first key is not a call's.
    NotACall,
    /// Text that cannot continue the object.
    Broken,
}

impl CallObject {
    fn new(bare: bool) -> Self {
        Self {
            phase: Phase::KeyOrEnd,
            name: None,
            early_arguments: None,
            arguments_given: false,
            bare,
            keys_seen: 0,
        }
    }

    /// The object cannot be read further: before the name this is not a call, after it the
    /// call ends here.
    fn broken(&self) -> ObjectStep {
        if self.name.is_none() {
            ObjectStep::NotACall
        } else {
            ObjectStep::Broken
        }
    }
}

#[cfg(test)]
mod tests;
