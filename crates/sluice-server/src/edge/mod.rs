//! The HTTP edge: what every request meets before and after its API's handler. The connection
//! loop, the API key, the JSON body extractor, server-sent events, the error shapes, the ids
//! handed out, the policy for request fields no typed field takes, and shutdown's drain.

pub mod auth;
pub mod error;
pub mod field_policy;
pub mod http;
pub mod ids;
pub mod json;
pub mod shutdown;
pub mod sse;
