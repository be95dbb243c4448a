//! The chat pipeline, shared by chat completions, Anthropic's Messages and the Responses API:
//! a conversation's tools planned, its output grammar chosen, its template rendered and its
//! sequences submitted ([`pipeline`]), then the generated text read back into reasoning,
//! answer and tool calls ([`output`], [`blocks`]).

pub mod blocks;
pub mod grammar;
pub mod output;
pub mod pipeline;
pub mod template;
pub mod thinking;
pub mod tools;
