//! Anthropic's Messages API (`POST /v1/messages`), for Claude-style clients pointed at a local
//! model: its bodies ([`types`]), their translation into the chat pipeline and back
//! ([`translate`]), and its error shape ([`errors`]). The route is `routes/messages.rs`.

pub mod errors;
pub mod translate;
pub mod types;
