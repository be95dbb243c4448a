//! sluice-tokenizer: text in and out of a model. Byte-level BPE with the pre-tokenizers GGUF
//! files name, vocabularies from GGUF metadata or a Hugging Face `tokenizer.json`, incremental
//! UTF-8-safe detokenization, and Jinja chat templates. Output parsers (tool calls, reasoning)
//! belong here too. Nothing here knows about tensors.

mod bpe;
pub mod byte_level;
pub mod chat;
pub mod detokenizer;
pub mod error;
pub mod gguf_metadata;
mod gguf_vocab;
mod hf_json;
mod parts;
mod pretokenize;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tokenizer;
mod vocab;

pub use byte_level::ByteLevelAlphabet;
pub use chat::{ChatMessage, ChatTemplate};
pub use detokenizer::IncrementalDecoder;
pub use error::{Result, TokenizerError};
pub use gguf_metadata::{GgufMetadata, MetadataMap, MetadataValue};
pub use tokenizer::{Tokenizer, SUPPORTED_PRE_TOKENIZERS};
