//! The HTTP edge: what every request meets before and after its API's handler, knowing nothing
//! of the engine. The connection loop, the API key, server-sent events, the error shapes, the
//! ids handed out, and the policy for request fields no typed field takes.

pub mod auth;
pub mod error;
pub mod field_policy;
pub mod http;
pub mod ids;
pub mod sse;
