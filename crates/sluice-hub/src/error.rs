//! What can go wrong between a hub name and a file in the cache, each saying what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(
        "the hub at {endpoint} answered {status} for {repo}: {}",
        if *token_sent {
            "HF_TOKEN (or the login token) lacks access to this repository (a gated model needs \
             its terms accepted on the hub first)"
        } else {
            "set HF_TOKEN to a token with access to it (the repository is private or gated)"
        }
    )]
    Unauthorized {
        endpoint: String,
        repo: String,
        status: u16,
        token_sent: bool,
    },
    #[error("the hub at {endpoint} has no repository {repo} at revision {revision}")]
    NotFound {
        endpoint: String,
        repo: String,
        revision: String,
    },
    #[error("the hub at {endpoint} answered {status} for {what}")]
    Status {
        endpoint: String,
        what: String,
        status: u16,
    },
    #[error("cannot reach the hub at {endpoint} ({source}); HF_HUB_OFFLINE=1 serves from the cache alone")]
    Unreachable {
        endpoint: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the hub's answer for {what} is not what it should be: {reason}")]
    BadAnswer { what: String, reason: String },
    #[error(
        "{repo} lists a file named {name:?}, which is not a plain relative path: the repository \
         is refused and nothing was written"
    )]
    UnsafePath { repo: String, name: String },
    #[error("{0}")]
    NoSuchFile(String),
    #[error(
        "{file} of {repo}: the downloaded bytes' sha256 is {got}, the hub lists {want}; the \
         file was deleted and not used"
    )]
    ChecksumMismatch {
        repo: String,
        file: String,
        want: String,
        got: String,
    },
    #[error("{file} of {repo}: the download stopped {attempts} times ({last}); run again to resume from where it stopped")]
    Interrupted {
        repo: String,
        file: String,
        attempts: usize,
        last: String,
    },
    #[error("HF_HUB_OFFLINE is set and the cache {cache} holds no {what}; unset it to download")]
    NotCached { cache: PathBuf, what: String },
    #[error("{context} ({path}): {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            context,
            path,
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, HubError>;
