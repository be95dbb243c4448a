//! sluice-model: turns a GGUF file or a Hugging Face directory into a model whose one batched forward computes every token
//! of an engine step (prefill chunks and decode tokens of many sequences) over a paged KV cache.

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod batch;
pub mod chat;
pub mod config;
pub mod dense;
pub mod detokenizer;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod quant;
pub mod rope;
mod simd;
pub mod source;
pub mod testing;
pub mod tokenizer;
pub mod weights;

pub use attention::AttentionBackend;
pub use batch::{SequenceSlice, StepBatch};
pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use detokenizer::IncrementalDecoder;
pub use error::{ModelError, Result};
pub use gguf::GgufFile;
pub use hf::HfModelDir;
pub use kv_cache::{KvCache, KvLayout};
pub use model::{LlamaModel, LoadOptions};
pub use source::ModelSource;
pub use tokenizer::Tokenizer;
pub use weights::WeightsKind;
