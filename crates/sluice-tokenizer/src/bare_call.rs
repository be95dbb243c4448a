//! Tool calls written without their format's markup. Small models offered tools often answer
//! with the call's JSON alone: Qwen2.5-Coder under opencode wrote
//! `{"name": "write", "arguments": {"content": "hello"}}` as its whole message, no
//! `<tool_call>` tags. When tools were offered, an answer that is exactly one JSON object (or
//! an array of them), each naming an offered tool with an object of arguments, is read as those
//! calls; any other answer, a JSON answer to a JSON question among them, stays text.
//!
//! The answer is held back only while it can still be such a call: from its first character
//! that is not `{` or `[`, a key other than a call's, a name no tool has, a value of the wrong
//! kind, or text after the closing bracket, it is released as it came.

use std::sync::Arc;

use crate::json_scan::{NestingScanner, StringLiteral};
use crate::tool_event::ToolEvent;

/// Where the scanner is in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// Only whitespace so far.
    Lead,
    /// Inside the top-level array, before a call object (after `[` or `,`).
    ArrayBeforeObject,
    /// Inside the top-level array, after a call object.
    ArrayAfterObject,
    /// At the level of a call object's keys.
    Object,
    /// Inside a call's arguments object.
    Arguments,
    /// The top-level value closed: only whitespace may follow.
    Trailing,
}

/// What comes next at the call object's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Just after `{`.
    FirstKey,
    /// After `,`.
    Key,
    Colon,
    Value,
    CommaOrEnd,
}

/// The keys a call object may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKey {
    Name,
    /// `arguments`, or Llama's `parameters`.
    Arguments,
}

/// A call object read so far: its name and where its arguments lie in the held text.
#[derive(Debug, Clone, Default)]
struct Candidate {
    name: Option<String>,
    arguments: Option<(usize, usize)>,
}

/// Reads an answer that may be a bare call, holding its text until it is decided.
#[derive(Debug, Clone)]
pub(crate) struct BareCallScanner {
    offered: Arc<[String]>,
    /// An opening character the format's own parser reads bare (Llama 3's `{`, Mistral's
    /// `[`): an answer opening with it is left to that parser.
    leave_to_format: Option<char>,
    held: String,
    position: Position,
    in_array: bool,
    expect: Expect,
    key: CallKey,
    /// A key, or a call's name, being read.
    literal: Option<StringLiteral>,
    /// Inside the arguments: their nesting.
    arguments: NestingScanner,
    arguments_start: usize,
    current: Candidate,
    calls: Vec<Candidate>,
}

impl BareCallScanner {
    pub(crate) fn new(offered: Arc<[String]>, leave_to_format: Option<char>) -> Self {
        Self {
            offered,
            leave_to_format,
            held: String::new(),
            position: Position::Lead,
            in_array: false,
            expect: Expect::FirstKey,
            key: CallKey::Name,
            literal: None,
            arguments: NestingScanner::default(),
            arguments_start: 0,
            current: Candidate::default(),
            calls: Vec::new(),
        }
    }

    /// Reads the next piece of the answer and holds it. False once the answer cannot be a
    /// bare call: the held text ([`BareCallScanner::into_held`]) is then plain output.
    pub(crate) fn feed(&mut self, text: &str) -> bool {
        let base = self.held.len();
        self.held.push_str(text);
        for (offset, c) in text.char_indices() {
            if !self.step(base + offset, c) {
                return false;
            }
        }
        true
    }

    /// Everything fed so far, as it came.
    pub(crate) fn into_held(self) -> String {
        self.held
    }

    /// At the end of the answer: the calls it is, when it is exactly a call or an array of
    /// calls (valid JSON, every call an offered name and an object of arguments); otherwise
    /// the held text, which is plain output.
    pub(crate) fn finish(self) -> Result<Vec<ToolEvent>, String> {
        let complete = self.position == Position::Trailing
            && serde_json::from_str::<serde_json::Value>(&self.held).is_ok();
        if !complete {
            return Err(self.held);
        }
        let mut events = Vec::with_capacity(2 * self.calls.len());
        for (index, call) in self.calls.into_iter().enumerate() {
            let (Some(name), Some((start, end))) = (call.name, call.arguments) else {
                return Err(self.held);
            };
            events.push(ToolEvent::CallStart { index, name });
            events.push(ToolEvent::CallArguments {
                index,
                fragment: self.held[start..end].to_string(),
            });
        }
        Ok(events)
    }

    /// Reads character `c` at byte `at` of the held text; false when it rules a call out.
    fn step(&mut self, at: usize, c: char) -> bool {
        match self.position {
            Position::Lead => match c {
                c if c.is_whitespace() => true,
                c if Some(c) == self.leave_to_format => false,
                '{' => self.open_object(),
                '[' => {
                    self.in_array = true;
                    self.position = Position::ArrayBeforeObject;
                    true
                }
                _ => false,
            },
            Position::ArrayBeforeObject => match c {
                c if c.is_whitespace() => true,
                '{' => self.open_object(),
                _ => false,
            },
            Position::ArrayAfterObject => match c {
                c if c.is_whitespace() => true,
                ',' => {
                    self.position = Position::ArrayBeforeObject;
                    true
                }
                ']' => {
                    self.position = Position::Trailing;
                    true
                }
                _ => false,
            },
            Position::Object => self.object_step(at, c),
            Position::Arguments => {
                if self.arguments.feed(c) {
                    self.current.arguments = Some((self.arguments_start, at + c.len_utf8()));
                    self.position = Position::Object;
                    self.expect = Expect::CommaOrEnd;
                }
                true
            }
            Position::Trailing => c.is_whitespace(),
        }
    }

    fn open_object(&mut self) -> bool {
        self.position = Position::Object;
        self.expect = Expect::FirstKey;
        self.current = Candidate::default();
        true
    }

    fn object_step(&mut self, at: usize, c: char) -> bool {
        if let Some(literal) = &mut self.literal {
            if !literal.feed(c) {
                return true;
            }
            let Some(value) = literal.decode() else {
                return false;
            };
            self.literal = None;
            return match self.expect {
                Expect::FirstKey | Expect::Key => {
                    let (key, seen) = match value.as_str() {
                        "name" => (CallKey::Name, self.current.name.is_some()),
                        "arguments" | "parameters" => {
                            (CallKey::Arguments, self.current.arguments.is_some())
                        }
                        _ => return false,
                    };
                    self.key = key;
                    self.expect = Expect::Colon;
                    !seen
                }
                // A name: one of the offered tools'.
                _ => {
                    let offered = self.offered.contains(&value);
                    self.current.name = Some(value);
                    self.expect = Expect::CommaOrEnd;
                    offered
                }
            };
        }
        if c.is_whitespace() {
            return true;
        }
        match (self.expect, c) {
            (Expect::FirstKey | Expect::Key, '"') => self.start_literal(c),
            (Expect::Colon, ':') => {
                self.expect = Expect::Value;
                true
            }
            (Expect::Value, '"') if self.key == CallKey::Name => self.start_literal(c),
            (Expect::Value, '{') if self.key == CallKey::Arguments => {
                self.position = Position::Arguments;
                self.arguments_start = at;
                self.arguments = NestingScanner::default();
                self.arguments.feed(c);
                // The arguments object itself is marked read once it closes.
                self.current.arguments = Some((at, at));
                true
            }
            (Expect::CommaOrEnd, ',') => {
                self.expect = Expect::Key;
                true
            }
            (Expect::CommaOrEnd, '}') => {
                let call = std::mem::take(&mut self.current);
                let whole = call.name.is_some() && call.arguments.is_some();
                self.calls.push(call);
                self.position = if self.in_array {
                    Position::ArrayAfterObject
                } else {
                    Position::Trailing
                };
                whole
            }
            _ => false,
        }
    }

    fn start_literal(&mut self, quote: char) -> bool {
        let mut literal = StringLiteral::default();
        literal.feed(quote);
        self.literal = Some(literal);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered() -> Arc<[String]> {
        vec!["write".to_string(), "read".to_string()].into()
    }

    /// Feeds `text` a character at a time; the calls, or the text given back.
    fn read(text: &str, leave: Option<char>) -> Result<Vec<ToolEvent>, String> {
        let mut scanner = BareCallScanner::new(offered(), leave);
        for c in text.chars() {
            if !scanner.feed(&c.to_string()) {
                return Err(format!("released: {}", scanner.into_held()));
            }
        }
        scanner.finish()
    }

    fn call(index: usize, name: &str, arguments: &str) -> [ToolEvent; 2] {
        [
            ToolEvent::CallStart {
                index,
                name: name.into(),
            },
            ToolEvent::CallArguments {
                index,
                fragment: arguments.into(),
            },
        ]
    }

    #[test]
    fn a_whole_answer_that_is_a_call_is_one() {
        let text = "{\"name\": \"write\", \"arguments\": {\"content\": \"he said \\\"}\\\"\", \
                    \"path\": \"a.txt\", \"n\": [1, {\"x\": 2}]}}\n";
        let args =
            "{\"content\": \"he said \\\"}\\\"\", \"path\": \"a.txt\", \"n\": [1, {\"x\": 2}]}";
        assert_eq!(read(text, None).unwrap(), call(0, "write", args).to_vec());
        // The arguments first, Llama's `parameters`, leading whitespace.
        assert_eq!(
            read("\n {\"parameters\": {}, \"name\": \"read\"}", None).unwrap(),
            call(0, "read", "{}").to_vec()
        );
    }

    #[test]
    fn an_array_of_calls_is_each_call() {
        let got = read(
            "[{\"name\": \"read\", \"arguments\": {\"p\": 1}}, {\"name\": \"write\", \"arguments\": {}}]",
            None,
        )
        .unwrap();
        let mut want = call(0, "read", "{\"p\": 1}").to_vec();
        want.extend(call(1, "write", "{}"));
        assert_eq!(got, want);
    }

    /// Anything else is released as soon as it cannot be a call, or given back at the end.
    #[test]
    fn other_answers_stay_text() {
        for released in [
            "Sure: {\"name\": \"write\"}",
            "{\"answer\": 4}",
            "{\"name\": \"delete\", \"arguments\": {}}",
            "{\"name\": \"write\", \"arguments\": \"{}\"}",
            "{\"name\": \"write\", \"name\": \"read\", \"arguments\": {}}",
            "{\"name\": \"write\", \"arguments\": {}} and then some",
            "[]",
            "[1, 2]",
            "{}",
            "{\"name\": \"write\"}",
        ] {
            let got = read(released, None).unwrap_err();
            let early = got
                .strip_prefix("released: ")
                .is_some_and(|prefix| released.starts_with(prefix));
            assert!(early || got == released, "{released}: {got}");
        }
        // Complete brackets that are not valid JSON, or cut off: given back whole at the end.
        for given_back in [
            "{\"name\": \"write\", \"arguments\": {\"a\": tru}}",
            "{\"name\": \"write\", \"arguments\": {\"a\": 1}",
            "  ",
        ] {
            assert_eq!(read(given_back, None).unwrap_err(), given_back);
        }
    }

    #[test]
    fn an_opening_the_format_reads_itself_is_left_to_it() {
        let text = "{\"name\": \"write\", \"arguments\": {}}";
        assert!(read(text, Some('{')).is_err());
        assert!(read(text, Some('[')).is_ok());
    }

    #[test]
    fn any_chunking_decides_the_same() {
        let text = "[{\"name\": \"write\", \"arguments\": {\"s\": \"é}]\"}}]";
        let whole = {
            let mut scanner = BareCallScanner::new(offered(), None);
            assert!(scanner.feed(text));
            scanner.finish().unwrap()
        };
        assert_eq!(read(text, None).unwrap(), whole);
    }
}
