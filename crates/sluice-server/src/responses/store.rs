//! The responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory,
//! bounded by count and by size, the oldest dropped first. A server restart forgets them
//! all (clients that need durable history keep it and send it as `input`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::openai::chat::ChatMessageIn;

use super::types::ResponseObject;

/// Most responses kept.
pub const MAX_RESPONSES: usize = 1024;
/// Most bytes of text kept (conversations and responses together), about.
pub const MAX_BYTES: usize = 64 << 20;

/// A response as kept: what it answered and its answer, as the conversation a continuation
/// starts from (without its `instructions`, which OpenAI does not carry over), and the
/// response itself.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub conversation: Arc<Vec<ChatMessageIn>>,
    pub response: Arc<ResponseObject>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, (StoredResponse, usize)>,
    /// Oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

#[derive(Clone, Default)]
pub struct ResponseStore {
    inner: Arc<Mutex<Inner>>,
    limits: (usize, usize),
}

impl ResponseStore {
    pub fn new() -> Self {
        Self::with_limits(MAX_RESPONSES, MAX_BYTES)
    }

    /// A store of at most `responses` entries and about `bytes` bytes.
    pub fn with_limits(responses: usize, bytes: usize) -> Self {
        Self {
            inner: Arc::default(),
            limits: (responses, bytes),
        }
    }

    fn size(stored: &StoredResponse) -> usize {
        let conversation: usize = stored
            .conversation
            .iter()
            .map(|m| {
                m.content.size_bytes()
                    + m.tool_calls.as_ref().map_or(0, |calls| {
                        calls
                            .iter()
                            .map(|c| c.function.name.len() + c.function.arguments.to_string().len())
                            .sum()
                    })
                    + 64
            })
            .sum();
        let response = serde_json::to_string(&*stored.response).map_or(0, |s| s.len());
        conversation + response
    }

    /// Keeps `stored` under its response's id, dropping the oldest entries past the bounds.
    /// A response larger than the whole store is not kept.
    pub fn insert(&self, stored: StoredResponse) {
        let size = Self::size(&stored);
        let (max_responses, max_bytes) = self.limits;
        if size > max_bytes || max_responses == 0 {
            tracing::debug!(id = %stored.response.id, size, "a response too large to store");
            return;
        }
        let id = stored.response.id.clone();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while inner.order.len() >= max_responses || inner.bytes + size > max_bytes {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, freed)) = inner.entries.remove(&oldest) {
                inner.bytes -= freed;
            }
        }
        inner.bytes += size;
        inner.order.push_back(id.clone());
        if let Some((_, replaced)) = inner.entries.insert(id, (stored, size)) {
            inner.bytes -= replaced;
        }
    }

    pub fn get(&self, id: &str) -> Option<StoredResponse> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.entries.get(id).map(|(s, _)| s.clone())
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::types::{Echo, ResponseObject};

    fn stored(id: &str, text: &str) -> StoredResponse {
        let message: ChatMessageIn =
            serde_json::from_value(serde_json::json!({"role": "user", "content": text})).unwrap();
        StoredResponse {
            conversation: Arc::new(vec![message]),
            response: Arc::new(ResponseObject {
                id: id.into(),
                object: "response",
                created_at: 0,
                status: "completed",
                model: "m".into(),
                output: Vec::new(),
                error: None,
                incomplete_details: None,
                usage: None,
                echo: Echo {
                    instructions: None,
                    max_output_tokens: None,
                    temperature: 1.0,
                    top_p: 1.0,
                    parallel_tool_calls: true,
                    tool_choice: serde_json::json!("auto"),
                    tools: Vec::new(),
                    text: serde_json::json!({"format": {"type": "text"}}),
                    previous_response_id: None,
                    store: true,
                    metadata: Default::default(),
                    user: None,
                    truncation: "disabled",
                },
            }),
        }
    }

    #[test]
    fn the_oldest_go_first_past_either_bound() {
        let store = ResponseStore::with_limits(2, 1 << 20);
        for id in ["a", "b", "c"] {
            store.insert(stored(id, "hello"));
        }
        assert_eq!(store.len(), 2);
        assert!(store.get("a").is_none());
        assert_eq!(
            store.get("c").unwrap().conversation[0]
                .content
                .template_text(),
            "hello"
        );

        let one = ResponseStore::size(&stored("x", &"y".repeat(1000)));
        let store = ResponseStore::with_limits(100, one * 2 + 10);
        for id in ["a", "b", "c"] {
            store.insert(stored(id, &"y".repeat(1000)));
        }
        assert!(store.get("a").is_none() && store.get("b").is_some() && store.get("c").is_some());
        // Larger than the whole store: not kept, nothing dropped for it.
        store.insert(stored("big", &"y".repeat(10_000)));
        assert!(store.get("big").is_none() && store.get("c").is_some());
    }
}
