//! sluice-tokenizer: text in and out of a model. Byte-level BPE with the pre-tokenizers GGUF
//! files name, SentencePiece as llama.cpp runs it, vocabularies from GGUF metadata or a Hugging Face `tokenizer.json`, incremental
//! UTF-8-safe detokenization, Jinja chat templates (with tools), and the parsers that split a
//! model's output into content, tool calls (`tool_parser`) and reasoning (`reasoning`), or by
//! Harmony's channels (`harmony`).
//! Nothing here knows about tensors.

mod bare_call;
mod bpe;
pub mod byte_level;
pub mod chat;
pub mod detokenizer;
pub mod error;
mod gguf_keys;
pub mod gguf_metadata;
mod gguf_spm;
mod gguf_vocab;
pub mod harmony;
mod hf_json;
mod json_scan;
mod partial_marker;
mod parts;
mod pretokenize;
mod python_json;
pub mod reasoning;
mod spm;
pub mod template_date;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tokenizer;
pub mod tool_event;
pub mod tool_parser;
mod vocab;

pub use byte_level::ByteLevelAlphabet;
pub use chat::{ChatFunctionCall, ChatMessage, ChatTemplate, ChatToolCall, RenderOptions};
pub use detokenizer::IncrementalDecoder;
pub use error::{Result, TokenizerError};
pub use gguf_metadata::{GgufMetadata, MetadataMap, MetadataValue};
pub use harmony::HarmonyParser;
pub use reasoning::{ReasoningEvent, ReasoningParser};
pub use template_date::TemplateDate;
pub use tokenizer::{Tokenizer, SUPPORTED_PRE_TOKENIZERS};
pub use tool_parser::{ToolCallFormat, ToolCallParser, ToolEvent};
