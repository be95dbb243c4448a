//! One chat choice's generated text split into what OpenAI's message has room for: the
//! reasoning of a thinking model (`reasoning_content`), the answer (`content`) and the tool
//! calls (`tool_calls`), as deltas while it streams and as a whole message at the end. The
//! markup around reasoning and calls never reaches `content`.

use std::sync::Arc;

use sluice_tokenizer::reasoning::{ReasoningEvent, ReasoningParser};
use sluice_tokenizer::tool_parser::{ToolCallFormat, ToolCallParser, ToolEvent};

use crate::openai::structured::{FunctionCallDelta, FunctionCallOut, ToolCallDelta, ToolCallOut};

/// What a piece of generated text adds to the message.
#[derive(Debug, Default)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.tool_calls.is_empty()
    }
}

/// How a chat request's output is read.
#[derive(Debug, Clone, Default)]
pub struct OutputFormat {
    /// The model thinks in `<think>` blocks; `true` in the pair: the prompt already opened one.
    pub reasoning: Option<bool>,
    /// Tool calls are parsed in this format. Harmony's is set whenever the model writes
    /// Harmony, tools or not: its parser also splits reasoning and answer by channel.
    pub tools: Option<ToolCallFormat>,
    /// Calls after the first are dropped (`parallel_tool_calls: false`).
    pub single_call: bool,
    /// The tools the model may call, when a whole answer that is a call's JSON without the
    /// format's markup is to be read as that call (`tool_choice` allows calls and no response
    /// format was asked for: [`ToolCallParser::with_bare_calls`]).
    pub bare_calls: Option<Arc<[String]>>,
}

struct Call {
    id: String,
    name: String,
    arguments: String,
}

/// The parsers of one choice and what they found.
pub struct ChoiceOutput {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolCallParser>,
    single_call: bool,
    calls: Vec<Call>,
    reasoning_tokens: usize,
    reasoning_events: Vec<ReasoningEvent>,
    tool_events: Vec<ToolEvent>,
}

impl ChoiceOutput {
    pub fn new(format: &OutputFormat) -> Self {
        let tools = format.tools.map(|f| match &format.bare_calls {
            Some(offered) => f.parser().with_bare_calls(offered.clone()),
            None => f.parser(),
        });
        Self {
            reasoning: format.reasoning.map(ReasoningParser::new),
            tools,
            single_call: format.single_call,
            calls: Vec::new(),
            reasoning_tokens: 0,
            reasoning_events: Vec::new(),
            tool_events: Vec::new(),
        }
    }

    /// Reads the text of the next token.
    pub fn push(&mut self, text: &str) -> Delta {
        let mut delta = Delta::default();
        self.split(text, false, &mut delta);
        // A token whose text went only to the reasoning counts as a reasoning token; one
        // that was held back whole counts with the side it lands on later, approximately.
        if !delta.reasoning.is_empty() && delta.content.is_empty() && delta.tool_calls.is_empty() {
            self.reasoning_tokens += 1;
        }
        delta
    }

    /// Releases what the parsers still hold, at the end of the output.
    pub fn finish(&mut self) -> Delta {
        let mut delta = Delta::default();
        self.split("", true, &mut delta);
        delta
    }

    fn split(&mut self, text: &str, last: bool, delta: &mut Delta) {
        let mut answer = String::new();
        match &mut self.reasoning {
            Some(parser) => {
                self.reasoning_events.clear();
                parser.push(text, &mut self.reasoning_events);
                if last {
                    parser.finish(&mut self.reasoning_events);
                }
                for event in self.reasoning_events.drain(..) {
                    match event {
                        ReasoningEvent::Reasoning(r) => delta.reasoning.push_str(&r),
                        ReasoningEvent::Content(c) => answer.push_str(&c),
                    }
                }
            }
            None => answer.push_str(text),
        }
        match &mut self.tools {
            Some(parser) => {
                self.tool_events.clear();
                parser.push(&answer, &mut self.tool_events);
                if last {
                    parser.finish(&mut self.tool_events);
                }
                for event in self.tool_events.drain(..) {
                    match event {
                        ToolEvent::Content(c) => delta.content.push_str(&c),
                        ToolEvent::Reasoning(r) => delta.reasoning.push_str(&r),
                        ToolEvent::CallStart { index, name } => {
                            if self.single_call && index > 0 {
                                continue;
                            }
                            let id = call_id();
                            delta.tool_calls.push(ToolCallDelta {
                                index,
                                id: Some(id.clone()),
                                kind: Some("function"),
                                function: FunctionCallDelta {
                                    name: Some(name.clone()),
                                    arguments: String::new(),
                                },
                            });
                            self.calls.push(Call {
                                id,
                                name,
                                arguments: String::new(),
                            });
                        }
                        ToolEvent::CallArguments { index, fragment } => {
                            let Some(call) = self.calls.get_mut(index) else {
                                continue;
                            };
                            call.arguments.push_str(&fragment);
                            delta.tool_calls.push(ToolCallDelta {
                                index,
                                id: None,
                                kind: None,
                                function: FunctionCallDelta {
                                    name: None,
                                    arguments: fragment,
                                },
                            });
                        }
                    }
                }
            }
            None => delta.content.push_str(&answer),
        }
    }

    pub fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// The calls found, whole, for a non-streamed message.
    pub fn calls(&self) -> Vec<ToolCallOut> {
        self.calls
            .iter()
            .map(|c| ToolCallOut {
                id: c.id.clone(),
                kind: "function",
                function: FunctionCallOut {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            })
            .collect()
    }
}

/// `call_` and 24 random hex digits, as OpenAI's ids look.
fn call_id() -> String {
    crate::edge::ids::random_id("call", '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: OutputFormat, pieces: &[&str]) -> (Delta, ChoiceOutput) {
        let mut out = ChoiceOutput::new(&format);
        let mut all = Delta::default();
        let mut merge = |d: Delta| {
            all.content.push_str(&d.content);
            all.reasoning.push_str(&d.reasoning);
            all.tool_calls.extend(d.tool_calls);
        };
        for p in pieces {
            merge(out.push(p));
        }
        merge(out.finish());
        (all, out)
    }

    #[test]
    fn plain_text_is_content() {
        let (d, out) = run(OutputFormat::default(), &["Hel", "lo <tool_call>"]);
        assert_eq!(d.content, "Hello <tool_call>");
        assert!(!out.has_calls());
    }

    #[test]
    fn hermes_calls_stream_as_deltas_and_never_leak() {
        let format = OutputFormat {
            tools: Some(ToolCallFormat::Hermes),
            ..Default::default()
        };
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (d, out) = run(format, &refs);
        assert_eq!(d.content.trim(), "Let me check.");
        assert!(!d.content.contains("tool_call"));
        assert_eq!(
            d.tool_calls[0].function.name.as_deref(),
            Some("get_weather")
        );
        assert!(d.tool_calls[0].id.is_some());
        let args: String = d
            .tool_calls
            .iter()
            .map(|c| c.function.arguments.as_str())
            .collect();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&args).unwrap(),
            serde_json::json!({"city": "Paris"})
        );
        let calls = out.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.arguments, args);
    }

    /// Offered tools under `auto`: an answer that is only a call's JSON, after any reasoning,
    /// is that call; without the offer, or as other JSON, it is content.
    #[test]
    fn a_bare_call_is_a_call_only_where_tools_were_offered() {
        let bare = "{\"name\": \"write\", \"arguments\": {\"content\": \"hello\"}}";
        let offered = OutputFormat {
            reasoning: Some(false),
            tools: Some(ToolCallFormat::Hermes),
            bare_calls: Some(vec!["write".to_string()].into()),
            ..Default::default()
        };
        let thought = format!("<think>It wants a file.</think>\n\n{bare}");
        let (d, out) = run(offered.clone(), &[&thought[..20], &thought[20..]]);
        assert_eq!(
            (d.reasoning.trim(), d.content.as_str()),
            ("It wants a file.", "")
        );
        assert_eq!(out.calls()[0].function.name, "write");
        assert_eq!(
            out.calls()[0].function.arguments,
            "{\"content\": \"hello\"}"
        );
        let (d, out) = run(offered, &["{\"answer\": 4}"]);
        assert_eq!(d.content, "{\"answer\": 4}");
        assert!(!out.has_calls());
        let plain = OutputFormat {
            tools: Some(ToolCallFormat::Hermes),
            ..Default::default()
        };
        let (d, out) = run(plain, &[bare]);
        assert_eq!(d.content, bare);
        assert!(!out.has_calls());
    }

    #[test]
    fn single_call_drops_later_calls() {
        let format = OutputFormat {
            tools: Some(ToolCallFormat::Hermes),
            single_call: true,
            ..Default::default()
        };
        let call = |n: &str| {
            format!("<tool_call>\n{{\"name\": \"{n}\", \"arguments\": {{}}}}\n</tool_call>\n")
        };
        let text = call("a") + &call("b");
        let (d, out) = run(format, &[&text]);
        assert_eq!(out.calls().len(), 1);
        assert!(d.tool_calls.iter().all(|c| c.index == 0));
    }

    #[test]
    fn reasoning_goes_to_its_own_field_before_calls_are_parsed() {
        let format = OutputFormat {
            reasoning: Some(false),
            tools: Some(ToolCallFormat::Hermes),
            ..Default::default()
        };
        let (d, out) = run(
            format,
            &["<think>\nI should", " answer.\n</think>\n\n", "Paris."],
        );
        assert_eq!(d.reasoning.trim(), "I should answer.");
        assert_eq!(d.content, "Paris.");
        assert!(out.reasoning_tokens() >= 1);
    }
}
