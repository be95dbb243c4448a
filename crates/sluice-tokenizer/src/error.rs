use std::path::PathBuf;

/// What can go wrong building a tokenizer, encoding text, or compiling and rendering a chat
/// template. Messages name the file and the reason, because the user who sees them is usually
/// holding the wrong file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: unsupported {what}")]
    Unsupported { path: PathBuf, what: String },
    #[error("{path}: missing or invalid metadata `{key}`: {reason}")]
    Metadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: cannot build the tokenizer: {reason}")]
    Build { path: PathBuf, reason: String },
    #[error("tokenizer error: {0}")]
    Encode(String),
    #[error("chat template error: {0}")]
    Template(String),
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
