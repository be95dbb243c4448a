//! sluice-model: turns a GGUF file or a Hugging Face directory into a model whose one batched
//! forward computes every token of an engine step (prefill chunks and decode tokens of many
//! sequences) over a paged KV cache.
//!
//! Loading: [`source`] opens either format; [`gguf`] and [`hf`] read their files and hand
//! tensors by role to the one layer builder in [`model`] through [`load::WeightSource`].
//! Computing: [`model`] runs the forward with [`weights`] (linear layers on our kernels or
//! candle's), [`attention`], [`rope`] and [`ops`], over the [`kv_cache`] and the
//! [`batch::StepBatch`] the scheduler fills; [`paged::PagedLlama`] is a model with its cache,
//! what the engine drives. With the `cuda` feature, a model on a GPU runs the whole step on
//! sluice's own CUDA kernels and cuBLAS (`cuda_forward`; measured on an H200: docs/gpu.md).

pub mod arch;
pub mod attention;
pub mod batch;
pub mod config;
mod cpu_forward;
#[cfg(feature = "cuda")]
mod cuda_forward;
#[cfg(feature = "cuda")]
mod cuda_graph;
#[cfg(feature = "cuda")]
mod cuda_layers;
#[cfg(feature = "cuda")]
mod cuda_profile;
mod embedding;
pub mod error;
pub mod gguf;
mod gguf_header;
mod gguf_keys;
pub mod hf;
mod hf_config;
mod hf_keys;
pub mod kv_cache;
mod last_layer;
mod layer;
pub mod load;
pub mod lora;
mod low_rank;
pub mod model;
mod model_sampling;
mod moe;
pub mod ops;
pub mod paged;
pub mod rope;
pub mod source;
pub mod synthetic;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod vision;
pub mod weights;

pub use attention::AttentionBackend;
pub use batch::{
    GroupTables, ImageRows, RowSampling, SampledToken, SequenceSlice, StepBatch, StepOutput,
};
pub use config::{Architecture, DeltaNetConfig, ModelConfig, MoeConfig, Pooling, RopeScaling};
pub use cpu_forward::StepScratch;
pub use error::{ModelError, Result};
pub use gguf::GgufFile;
pub use hf::HfModelDir;
pub use kv_cache::{
    cache_groups, CacheGroup, CacheKind, KvCache, KvDtype, KvLayout, KvPools, WindowDemand,
};
pub use load::{CudaGraphs, LoadOptions};
pub use lora::{LoraAdapter, Projection as LoraProjection};
pub use model::LlamaModel;
pub use paged::PagedLlama;
pub use sluice_kernels::sampling;
pub use source::ModelSource;
pub use weights::WeightsKind;
