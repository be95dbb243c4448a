//! What the server tells its operators, knowing nothing of the engine glue above it:
//! Prometheus metrics (sluice's own and vLLM's names for the routers) and the KV-cache events
//! routers subscribe to.

pub mod kv_events;
pub mod metrics;
pub mod vllm_metrics;
