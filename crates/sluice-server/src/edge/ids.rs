//! Ids of what the server hands out: requests, responses, items, tool calls.

use rand::Rng;

/// `prefix`, `separator` and 24 random hex digits: `call_…`, `msg_…`, `resp_…`.
pub fn random_id(prefix: &str, separator: char) -> String {
    let bits: u128 = rand::thread_rng().gen();
    format!("{prefix}{separator}{:024x}", bits >> 32)
}
