//! The tokenizer keys every GGUF vocabulary has, whatever its model (`gguf_vocab` reads the
//! byte-level BPE ones and `gguf_spm` the SentencePiece ones), and a reader of the metadata whose
//! errors name the file and the key.

use std::path::Path;

use crate::error::{Result, TokenizerError};
use crate::gguf_metadata::GgufMetadata;

pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_TYPES: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
pub(crate) const KEY_TEMPLATE: &str = "tokenizer.chat_template";

/// GGUF metadata with errors that name the file and the key.
pub(crate) struct Metadata<'a> {
    pub(crate) metadata: &'a dyn GgufMetadata,
    pub(crate) path: &'a Path,
}

impl<'a> Metadata<'a> {
    /// The id `tokenizer.ggml.<name>` names in an `n`-token vocabulary; `None` when absent,
    /// negative (some converters' "none") or out of range (ignored with a warning, as
    /// llama.cpp does: the file stays usable).
    pub(crate) fn token_id(&self, name: &str, n: usize) -> Result<Option<u32>> {
        let key = format!("tokenizer.ggml.{name}");
        match self.optional_int(&key)? {
            Some(id) if id >= 0 && (id as u64) < n as u64 => Ok(Some(id as u32)),
            Some(id) if id < 0 => Ok(None),
            Some(id) => {
                tracing::warn!(path = %self.path.display(), "{key} = {id} is outside the {n}-token vocabulary; ignored");
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// The vocabulary's pieces (`tokenizer.ggml.tokens`), present and not empty, whatever
    /// the tokenizer model.
    pub(crate) fn tokens(&self) -> Result<Vec<&'a str>> {
        let tokens = self
            .string_array(KEY_TOKENS)?
            .ok_or_else(|| self.missing(KEY_TOKENS))?;
        if tokens.is_empty() {
            return Err(self.invalid(KEY_TOKENS, "the vocabulary is empty"));
        }
        Ok(tokens)
    }

    pub(crate) fn missing(&self, key: &str) -> TokenizerError {
        self.invalid(key, "not present")
    }

    pub(crate) fn invalid(&self, key: &str, reason: &str) -> TokenizerError {
        TokenizerError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }

    fn checked<T>(&self, key: &str, value: std::result::Result<T, String>) -> Result<T> {
        value.map_err(|reason| self.invalid(key, &reason))
    }

    pub(crate) fn required_str(&self, key: &str) -> Result<&'a str> {
        self.optional_str(key)?.ok_or_else(|| self.missing(key))
    }

    pub(crate) fn optional_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.checked(key, self.metadata.string(key))
    }

    pub(crate) fn optional_bool(&self, key: &str) -> Result<Option<bool>> {
        self.checked(key, self.metadata.boolean(key))
    }

    pub(crate) fn optional_int(&self, key: &str) -> Result<Option<i64>> {
        self.checked(key, self.metadata.integer(key))
    }

    pub(crate) fn string_array(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        self.checked(key, self.metadata.strings(key))
    }

    pub(crate) fn int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.checked(key, self.metadata.integers(key))
    }

    pub(crate) fn float_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.checked(key, self.metadata.floats(key))
    }
}
