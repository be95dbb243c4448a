//! What a tokenizer source (GGUF metadata, a `tokenizer.json`) hands to
//! [`Tokenizer`](crate::tokenizer::Tokenizer): its encoder, its vocabulary table and its
//! special ids.

use crate::bpe::ByteLevelBpe;
use crate::error::{Result, TokenizerError};
use crate::spm::SentencePiece;
use crate::vocab::TokenTable;

/// What turns text into ids.
pub(crate) enum Encoder {
    /// Our byte-level BPE, for GGUF vocabularies.
    ByteLevelBpe(Box<ByteLevelBpe>),
    /// Our SentencePiece, for GGUF vocabularies of the `llama` kind.
    SentencePiece(Box<SentencePiece>),
    /// A `tokenizer.json`, run by the `tokenizers` crate.
    HuggingFace(Box<tokenizers::Tokenizer>),
}

impl Encoder {
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Self::ByteLevelBpe(bpe) => Ok(bpe.encode(text)),
            Self::SentencePiece(spm) => Ok(spm.encode(text)),
            // `encode_fast` skips offset bookkeeping we never read.
            Self::HuggingFace(hf) => hf
                .encode_fast(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|e| TokenizerError::Encode(e.to_string())),
        }
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            Self::ByteLevelBpe(bpe) => bpe.token_to_id(token),
            Self::SentencePiece(spm) => spm.token_to_id(token),
            Self::HuggingFace(hf) => hf.token_to_id(token),
        }
    }
}

/// What a tokenizer source (GGUF metadata, tokenizer.json) provides; [`Tokenizer::assemble`]
/// derives the rest.
pub(crate) struct TokenizerParts {
    pub(crate) encoder: Encoder,
    pub(crate) table: TokenTable,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) pad: Option<u32>,
    /// Further end-of-generation ids the source names explicitly (GGUF `eot`/`eom` ids).
    pub(crate) extra_eog: Vec<u32>,
    pub(crate) add_bos: bool,
    /// Whether a whole input (an embedding's) ends with EOS (GGUF `tokenizer.ggml.add_eos_token`,
    /// `add_eos_token` of `tokenizer_config.json`): embedding models pooled on their last token
    /// (Qwen3-Embedding) were trained with it.
    pub(crate) add_eos: bool,
    /// Whether decoding a text drops one leading space from its first token: the space a
    /// SentencePiece encoding put in front (`add_space_prefix`), as llama.cpp's `detokenize`
    /// drops it.
    pub(crate) strip_first_space: bool,
    pub(crate) chat_template: Option<String>,
}
