//! A choice's streamed output as a sequence of blocks, each started, extended and stopped in
//! order: its reasoning, its text, and each tool call. Anthropic's content blocks and the
//! Responses API's output items are both this sequence; each API names the events its own
//! way (`routes/messages.rs`, `routes/responses.rs`).

use crate::chat::output::Delta;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Reasoning,
    Text,
    ToolCall,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockEvent {
    /// A block opens at `index` (0, 1, ... in order). A call's block knows its id and name.
    Start {
        index: usize,
        kind: BlockKind,
        call: Option<(String, String)>,
    },
    /// More of the open block: reasoning or answer text, or a piece of a call's arguments.
    Delta {
        index: usize,
        kind: BlockKind,
        text: String,
    },
    Stop {
        index: usize,
    },
}

/// Turns a choice's deltas into block events.
#[derive(Debug, Default)]
pub struct BlockStream {
    /// The open block's index, or the next block's.
    index: usize,
    open: Option<BlockKind>,
}

impl BlockStream {
    fn stop(&mut self, out: &mut Vec<BlockEvent>) {
        if self.open.take().is_some() {
            out.push(BlockEvent::Stop { index: self.index });
            self.index += 1;
        }
    }

    fn start(
        &mut self,
        kind: BlockKind,
        call: Option<(String, String)>,
        out: &mut Vec<BlockEvent>,
    ) {
        self.stop(out);
        out.push(BlockEvent::Start {
            index: self.index,
            kind,
            call,
        });
        self.open = Some(kind);
    }

    /// Extends the open block of `kind`, opening one when another kind (or none) is open.
    fn extend(&mut self, kind: BlockKind, text: String, out: &mut Vec<BlockEvent>) {
        if self.open != Some(kind) {
            self.start(kind, None, out);
        }
        out.push(BlockEvent::Delta {
            index: self.index,
            kind,
            text,
        });
    }

    /// The events of what one piece of output added.
    pub fn push(&mut self, delta: Delta, out: &mut Vec<BlockEvent>) {
        if !delta.reasoning.is_empty() {
            self.extend(BlockKind::Reasoning, delta.reasoning, out);
        }
        if !delta.content.is_empty() {
            self.extend(BlockKind::Text, delta.content, out);
        }
        for call in delta.tool_calls {
            if let (Some(id), Some(name)) = (call.id, call.function.name) {
                self.start(BlockKind::ToolCall, Some((id, name)), out);
            }
            if !call.function.arguments.is_empty() && self.open == Some(BlockKind::ToolCall) {
                out.push(BlockEvent::Delta {
                    index: self.index,
                    kind: BlockKind::ToolCall,
                    text: call.function.arguments,
                });
            }
        }
    }

    /// Stops the last block. An output with no block at all gets one empty text block, as its
    /// whole (non-streamed) form has.
    pub fn finish(&mut self, out: &mut Vec<BlockEvent>) {
        if self.index == 0 && self.open.is_none() {
            self.start(BlockKind::Text, None, out);
        }
        self.stop(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::structured::{FunctionCallDelta, ToolCallDelta};

    fn call(id: Option<&str>, name: Option<&str>, args: &str) -> ToolCallDelta {
        ToolCallDelta {
            index: 0,
            id: id.map(String::from),
            kind: None,
            function: FunctionCallDelta {
                name: name.map(String::from),
                arguments: args.into(),
            },
        }
    }

    #[test]
    fn blocks_open_and_close_in_order() {
        let mut s = BlockStream::default();
        let mut out = Vec::new();
        let piece = |reasoning: &str, content: &str, tool_calls| Delta {
            reasoning: reasoning.into(),
            content: content.into(),
            tool_calls,
        };
        s.push(piece("hm", "", vec![]), &mut out);
        s.push(piece("", "Hi", vec![]), &mut out);
        s.push(piece("", "!", vec![]), &mut out);
        s.push(
            piece("", "", vec![call(Some("c1"), Some("f"), "{")]),
            &mut out,
        );
        s.push(piece("", "", vec![call(None, None, "}")]), &mut out);
        s.finish(&mut out);
        let start = |index, kind, call: Option<(&str, &str)>| BlockEvent::Start {
            index,
            kind,
            call: call.map(|(a, b)| (a.into(), b.into())),
        };
        let delta = |index, kind, text: &str| BlockEvent::Delta {
            index,
            kind,
            text: text.into(),
        };
        assert_eq!(
            out,
            vec![
                start(0, BlockKind::Reasoning, None),
                delta(0, BlockKind::Reasoning, "hm"),
                BlockEvent::Stop { index: 0 },
                start(1, BlockKind::Text, None),
                delta(1, BlockKind::Text, "Hi"),
                delta(1, BlockKind::Text, "!"),
                BlockEvent::Stop { index: 1 },
                start(2, BlockKind::ToolCall, Some(("c1", "f"))),
                delta(2, BlockKind::ToolCall, "{"),
                delta(2, BlockKind::ToolCall, "}"),
                BlockEvent::Stop { index: 2 },
            ]
        );
        let mut empty = BlockStream::default();
        let mut out = Vec::new();
        empty.finish(&mut out);
        assert_eq!(
            out,
            vec![
                start(0, BlockKind::Text, None),
                BlockEvent::Stop { index: 0 }
            ]
        );
    }
}
