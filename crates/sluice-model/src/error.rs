use std::path::PathBuf;

/// Everything that can go wrong turning files into a model or tokenizer. Messages name the file
/// and the reason, because the user who sees them is usually holding the wrong file.
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
    #[error("{path}: cannot build the tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("tokenizer error: {0}")]
    Encode(String),
    #[error("chat template error: {0}")]
    Template(String),
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
