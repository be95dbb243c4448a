//! The routes about the server rather than generation: health, version, the model list,
//! metrics, the KV-cache debug routes and the OpenAPI document.

pub mod health;
pub mod kv_cache;
pub mod metrics;
pub mod models;
pub mod openapi;
pub mod version;
