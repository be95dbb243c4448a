//! What the server tells its operators: Prometheus metrics (sluice's own and vLLM's names for
//! the routers), log output, and the KV-cache events routers subscribe to.

pub mod kv_events;
pub mod logging;
pub mod metrics;
pub mod vllm_metrics;
