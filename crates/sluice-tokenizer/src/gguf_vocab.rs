//! Rebuilds a tokenizer from GGUF `tokenizer.ggml.*` metadata, reading the same keys llama.cpp
//! does. `tokenizer.ggml.model` picks the kind: `gpt2` is byte-level BPE, built here
//! (vocabulary, merges, token types, special ids, and the pre-tokenizer chosen by name,
//! `tokenizer.ggml.pre`, since GGUF stores only the name, not the regexes); `llama` is
//! SentencePiece, built by `gguf_spm`.

use std::path::Path;

use crate::bpe::ByteLevelBpe;
use crate::error::{Result, TokenizerError};
use crate::gguf_keys::{Metadata, KEY_ADD_BOS, KEY_ADD_EOS, KEY_TEMPLATE, KEY_TOKENS, KEY_TYPES};
use crate::gguf_metadata::GgufMetadata;
use crate::gguf_spm;
use crate::parts::{Encoder, TokenizerParts};
use crate::pretokenize::{PreTokenizer, SUPPORTED_NAMES};
use crate::vocab::{PieceEncoding, TokenKind, TokenTable};

pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// The `tokenizer.ggml.model` values we build, with what each is.
const SUPPORTED_MODELS: &str = "`gpt2` (byte-level BPE), `llama` (SentencePiece)";

/// GGUF token types (llama.cpp's `llama_token_type`).
fn token_kind(token_type: i64) -> TokenKind {
    match token_type {
        // 2 unknown, 3 control.
        2 | 3 => TokenKind::Special,
        // 4 user-defined.
        4 => TokenKind::Literal,
        // 1 normal, 5 unused, 6 byte, and anything newer: plain vocabulary pieces.
        _ => TokenKind::Normal,
    }
}

pub(crate) fn build(metadata: &dyn GgufMetadata, path: &Path) -> Result<TokenizerParts> {
    let meta = Metadata { metadata, path };

    match meta.required_str(KEY_MODEL)? {
        "gpt2" => build_bpe(&meta),
        "llama" => gguf_spm::build(&meta),
        model => Err(TokenizerError::Unsupported {
            path: path.to_path_buf(),
            what: format!("tokenizer model `{model}` ({KEY_MODEL}); supported: {SUPPORTED_MODELS}"),
        }),
    }
}

fn build_bpe(meta: &Metadata) -> Result<TokenizerParts> {
    let path = meta.path;
    let pre_name = match meta.optional_str(KEY_PRE)? {
        Some(name) => name,
        None => {
            tracing::warn!(
                path = %path.display(),
                "no {KEY_PRE} in the GGUF file; using GPT-2's pre-tokenizer"
            );
            "default"
        }
    };
    let pre =
        PreTokenizer::from_gguf_name(pre_name).ok_or_else(|| TokenizerError::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "pre-tokenizer `{pre_name}` ({KEY_PRE}); supported: {}",
                SUPPORTED_NAMES.join(", ")
            ),
        })?;

    let tokens = meta.tokens()?;
    let n = tokens.len();
    let kinds: Vec<TokenKind> = match meta.int_array(KEY_TYPES)? {
        Some(types) if types.len() == n => types.into_iter().map(token_kind).collect(),
        Some(types) => {
            return Err(meta.invalid(KEY_TYPES, &format!("{} types for {n} tokens", types.len())))
        }
        None => vec![TokenKind::Normal; n],
    };
    let merges: Vec<(&str, &str)> = meta
        .string_array(KEY_MERGES)?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, merge)| match merge.split_once(' ') {
            Some(pair) => Ok(pair),
            None => Err(meta.invalid(
                KEY_MERGES,
                &format!("merge {i} `{merge}` is not two tokens separated by a space"),
            )),
        })
        .collect::<Result<_>>()?;

    let token_id = |name: &str| meta.token_id(name, n);
    let bos = token_id("bos_token_id")?;
    let eos = token_id("eos_token_id")?;
    let pad = token_id("padding_token_id")?;
    // `unknown_token_id` is not read: a byte-level vocabulary spells every byte, and a byte it
    // lacks is dropped rather than encoded as UNK (see `bpe`).
    let extra_eog: Vec<u32> = [token_id("eot_token_id")?, token_id("eom_token_id")?]
        .into_iter()
        .flatten()
        .collect();
    // llama.cpp's default when the file does not say: only Llama 3 vocabularies want BOS.
    let add_bos = meta
        .optional_bool(KEY_ADD_BOS)?
        .unwrap_or(pre == PreTokenizer::Llama3);
    // llama.cpp's default: no EOS unless the file asks for it.
    let add_eos = meta.optional_bool(KEY_ADD_EOS)?.unwrap_or(false);
    let chat_template = meta.optional_str(KEY_TEMPLATE)?.map(str::to_string);

    let table = TokenTable::new(
        tokens
            .iter()
            .zip(kinds)
            .map(|(token, kind)| (Some(token.to_string()), kind))
            .collect(),
        PieceEncoding::ByteLevel,
    );
    // Llama 3 looks a whole word up before merging (llama.cpp's `ignore_merges`).
    let ignore_merges = pre == PreTokenizer::Llama3;
    let bpe =
        ByteLevelBpe::new(&tokens, &table, &merges, pre, ignore_merges).map_err(|reason| {
            TokenizerError::Build {
                path: path.to_path_buf(),
                reason,
            }
        })?;
    Ok(TokenizerParts {
        encoder: Encoder::ByteLevelBpe(Box::new(bpe)),
        table,
        bos,
        eos,
        pad,
        extra_eog,
        add_bos,
        add_eos,
        strip_first_space: false,
        chat_template,
    })
}

/// The vocabulary of a GGUF file as a Hugging Face `tokenizer.json`: a BPE model with its
/// vocabulary and merges, the pre-tokenizer `tokenizer.ggml.pre` names (as the vocabulary's own
/// tokenizer.json declares it), a ByteLevel decoder, and the control (special) and user-defined
/// tokens as added tokens. Special ids and the chat template belong in tokenizer_config.json.
pub(crate) fn to_hf_json(metadata: &dyn GgufMetadata, path: &Path) -> Result<String> {
    use tokenizers::models::bpe::{Vocab, BPE};
    let meta = Metadata { metadata, path };
    let model = meta.required_str(KEY_MODEL)?;
    match model {
        "gpt2" => {}
        "llama" => return gguf_spm::to_hf_json(&meta),
        _ => {
            return Err(TokenizerError::Unsupported {
                path: path.to_path_buf(),
                what: format!(
                    "tokenizer model `{model}` ({KEY_MODEL}) as a tokenizer.json; supported: \
                     `gpt2`, `llama`"
                ),
            })
        }
    }
    // Validates everything and gives each id its kind.
    let parts = build(metadata, path)?;
    let tokens = meta
        .string_array(KEY_TOKENS)?
        .ok_or_else(|| meta.missing(KEY_TOKENS))?;
    let merges: Vec<(String, String)> = meta
        .string_array(KEY_MERGES)?
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.split_once(' '))
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let pre_name = meta.optional_str(KEY_PRE)?.unwrap_or("default");
    let pre = PreTokenizer::from_gguf_name(pre_name).expect("build checked the pre-tokenizer");
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.to_string(), id as u32))
        .collect();
    let err = |reason: String| TokenizerError::Build {
        path: path.to_path_buf(),
        reason,
    };
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre == PreTokenizer::Llama3)
        .build()
        .map_err(|e| err(e.to_string()))?;
    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(pre.hf_pre_tokenizer()));
    hf.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    let added = |kind: TokenKind| -> Vec<tokenizers::AddedToken> {
        (0..tokens.len())
            .filter(|&id| parts.table.kind(id as u32) == Some(kind))
            .map(|id| {
                tokenizers::AddedToken::from(tokens[id].to_string(), kind == TokenKind::Special)
            })
            .collect()
    };
    hf.add_special_tokens(&added(TokenKind::Special));
    hf.add_tokens(&added(TokenKind::Literal));
    hf.to_string(false).map_err(|e| err(e.to_string()))
}
