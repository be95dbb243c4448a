//! OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`), for clients built
//! on it (the Agents SDK, Codex): its bodies ([`types`]), their translation into the chat
//! pipeline and back ([`translate`]), and the bounded in-memory store that `store` and
//! `previous_response_id` use (`crate::responses::store`, held with the server's
//! state). The routes are `routes/responses.rs`.

pub mod store;
pub mod translate;
pub mod types;
