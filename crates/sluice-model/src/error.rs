use std::path::PathBuf;

use sluice_kernels::cpu::attention::AttentionError;
use sluice_tokenizer::TokenizerError;

/// Everything that can go wrong turning files into a model, sizing its KV cache, or running a
/// step. Loading messages name the file and the reason, because the user who sees them is
/// usually holding the wrong file.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid GGUF file: {reason}")]
    Gguf { path: PathBuf, reason: String },
    #[error("{path}: unsupported {what}")]
    Unsupported { path: PathBuf, what: String },
    #[error("{path}: missing or invalid metadata `{key}`: {reason}")]
    Metadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path} is not a Hugging Face model directory: {reason}")]
    HfDirectory { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    InvalidFile { path: PathBuf, reason: String },
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: cannot read tensor `{name}`: {reason}")]
    Tensor {
        path: PathBuf,
        name: String,
        reason: String,
    },
    /// Weights that cannot be rearranged as the forward needs (un-permuting, fusing).
    #[error("cannot lay out the weights: {0}")]
    WeightLayout(String),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A KV cache that cannot be built: element type, zero or too many blocks.
    #[error("invalid KV cache: {0}")]
    KvCache(String),
    #[error(
        "a KV cache budget of {budget_bytes} bytes holds no block: one block of {block_size} \
         tokens takes {block_bytes} bytes"
    )]
    KvCacheBudget {
        budget_bytes: usize,
        block_size: usize,
        block_bytes: usize,
    },
    /// A step batch that does not fit the model or its cache (ids, positions, slots).
    #[error("invalid step batch: {0}")]
    InvalidStep(String),
    /// A CPU kernel handed a tensor that lives on another device.
    #[error("{0} is not in CPU memory, which the CPU kernels need")]
    NotOnCpu(&'static str),
    #[error(transparent)]
    Attention(#[from] AttentionError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
