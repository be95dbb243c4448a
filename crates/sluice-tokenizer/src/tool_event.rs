//! What the output parsers give out: a reply's content, its tool calls and (Harmony's) reasoning,
//! piece by piece as the text streams. Shared by [`crate::tool_parser`] and [`crate::harmony`].

/// What the parser found in the text pushed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text of the reply that is not a call: the model's own words, never call markup.
    Content(String),
    /// Call `index` (0, 1, ... in the order the model wrote them) names function `name`.
    CallStart { index: usize, name: String },
    /// The next piece of call `index`'s arguments. A call's fragments joined are its arguments
    /// object exactly as the model wrote it (or `{}` when it wrote none).
    CallArguments { index: usize, fragment: String },
    /// Text of the model's reasoning: only Harmony has a channel for it (`analysis`); the
    /// other formats' reasoning is read by [`ReasoningParser`](crate::ReasoningParser) first.
    Reasoning(String),
}
