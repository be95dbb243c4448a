//! Rebuilds a byte-level BPE tokenizer from GGUF `tokenizer.ggml.*` metadata, reading the same
//! keys llama.cpp does: vocabulary, merges, token types, special ids, and the pre-tokenizer
//! chosen by name (`tokenizer.ggml.pre`), since GGUF stores only the name, not the regexes.

use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use super::bpe::ByteLevelBpe;
use super::pretokenize::{PreTokenizer, SUPPORTED_NAMES};
use super::{Encoder, PieceEncoding, TokenKind, TokenTable, TokenizerParts};
use crate::error::{ModelError, Result};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_TEMPLATE: &str = "tokenizer.chat_template";

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

pub(super) fn build(content: &Content, path: &Path) -> Result<TokenizerParts> {
    let meta = Metadata { content, path };

    let model = meta.required_str(KEY_MODEL)?;
    if model != "gpt2" {
        return Err(ModelError::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "tokenizer model `{model}` ({KEY_MODEL}); supported: `gpt2` (byte-level BPE)"
            ),
        });
    }
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
    let pre = PreTokenizer::from_gguf_name(pre_name).ok_or_else(|| ModelError::Unsupported {
        path: path.to_path_buf(),
        what: format!(
            "pre-tokenizer `{pre_name}` ({KEY_PRE}); supported: {}",
            SUPPORTED_NAMES.join(", ")
        ),
    })?;

    let tokens = meta
        .string_array(KEY_TOKENS)?
        .ok_or_else(|| meta.missing(KEY_TOKENS))?;
    if tokens.is_empty() {
        return Err(meta.invalid(KEY_TOKENS, "the vocabulary is empty"));
    }
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

    let token_id = |key: &str| -> Result<Option<u32>> {
        let key = format!("tokenizer.ggml.{key}");
        match meta.optional_int(&key)? {
            Some(id) if id >= 0 && (id as u64) < n as u64 => Ok(Some(id as u32)),
            // Negative ids mean "none" in some converters.
            Some(id) if id < 0 => Ok(None),
            Some(id) => {
                // llama.cpp ignores an out-of-range special id too; the file stays usable.
                tracing::warn!(path = %path.display(), "{key} = {id} is outside the {n}-token vocabulary; ignored");
                Ok(None)
            }
            None => Ok(None),
        }
    };
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
            ModelError::Tokenizer {
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
        chat_template,
    })
}

/// The vocabulary of a GGUF file as a Hugging Face `tokenizer.json`: a BPE model with its
/// vocabulary and merges, the pre-tokenizer `tokenizer.ggml.pre` names (as the vocabulary's own
/// tokenizer.json declares it), a ByteLevel decoder, and the control (special) and user-defined
/// tokens as added tokens. Special ids and the chat template belong in tokenizer_config.json.
pub(super) fn to_hf_json(content: &Content, path: &Path) -> Result<String> {
    use tokenizers::models::bpe::{Vocab, BPE};
    // Validates everything and gives each id its kind.
    let parts = build(content, path)?;
    let meta = Metadata { content, path };
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
    let err = |reason: String| ModelError::Tokenizer {
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

/// Typed, error-reporting access to GGUF metadata values.
struct Metadata<'a> {
    content: &'a Content,
    path: &'a Path,
}

impl<'a> Metadata<'a> {
    fn missing(&self, key: &str) -> ModelError {
        self.invalid(key, "not present")
    }

    fn invalid(&self, key: &str, reason: &str) -> ModelError {
        ModelError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.content.metadata.get(key)
    }

    fn required_str(&self, key: &str) -> Result<&'a str> {
        self.optional_str(key)?.ok_or_else(|| self.missing(key))
    }

    fn optional_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.invalid(key, &format!("expected a string, found {other:?}"))),
        }
    }

    fn optional_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.invalid(key, &format!("expected a bool, found {other:?}"))),
        }
    }

    fn optional_int(&self, key: &str) -> Result<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => int_value(value)
                .map(Some)
                .ok_or_else(|| self.invalid(key, &format!("expected an integer, found {value:?}"))),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a [Value]>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.invalid(
                key,
                &format!("expected an array, found a {:?}", other.value_type()),
            )),
        }
    }

    fn string_array(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.as_str()),
                other => Err(self.invalid(
                    key,
                    &format!("element {i} is a {:?}, not a string", other.value_type()),
                )),
            })
            .collect::<Result<_>>()
            .map(Some)
    }

    fn int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                int_value(item).ok_or_else(|| {
                    self.invalid(
                        key,
                        &format!("element {i} is a {:?}, not an integer", item.value_type()),
                    )
                })
            })
            .collect::<Result<_>>()
            .map(Some)
    }
}

/// Any GGUF integer as i64 (converters disagree on widths and signedness of ids and types).
fn int_value(value: &Value) -> Option<i64> {
    Some(match *value {
        Value::U8(v) => v.into(),
        Value::I8(v) => v.into(),
        Value::U16(v) => v.into(),
        Value::I16(v) => v.into(),
        Value::U32(v) => v.into(),
        Value::I32(v) => v.into(),
        Value::U64(v) => i64::try_from(v).ok()?,
        Value::I64(v) => v,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::tiny_content;
    use super::super::Tokenizer;
    use super::*;

    fn build_err(content: &Content) -> String {
        match Tokenizer::from_gguf(content, Path::new("x.gguf")) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_supported_pre_tokenizer_builds() {
        for name in SUPPORTED_NAMES {
            let tok = Tokenizer::from_gguf(&tiny_content(name), Path::new("x.gguf"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(tok.encode(" the 12").unwrap().len(), 4, "{name}");
        }
    }

    #[test]
    fn llama3_takes_whole_words_from_the_vocabulary() {
        // "xyz" is a token no merge produces: Llama 3 still finds it, GPT-2 spells it out.
        let mut content = tiny_content("llama3");
        if let Some(Value::Array(tokens)) = content.metadata.get_mut(KEY_TOKENS) {
            tokens.push(Value::String("xyz".into()));
        }
        if let Some(Value::Array(types)) = content.metadata.get_mut(KEY_TYPES) {
            types.push(Value::I32(1));
        }
        let llama3 = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
        assert_eq!(llama3.encode("xyz").unwrap(), vec![262]);
        content
            .metadata
            .insert(KEY_PRE.into(), Value::String("gpt-2".into()));
        let gpt2 = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
        assert_eq!(gpt2.encode("xyz").unwrap().len(), 3);
        // Llama 3 vocabularies want BOS unless the file says otherwise.
        assert!(llama3.add_bos_token() && !gpt2.add_bos_token());
    }

    #[test]
    fn unsupported_model_and_pre_tokenizer_are_named() {
        let mut content = tiny_content("gpt-2");
        content
            .metadata
            .insert(KEY_MODEL.into(), Value::String("llama".into()));
        let err = build_err(&content);
        assert!(err.contains("x.gguf") && err.contains("`llama`") && err.contains("gpt2"));

        let err = build_err(&tiny_content("bogus-pre"));
        assert!(
            err.contains("`bogus-pre`") && err.contains("smollm"),
            "{err}"
        );
    }

    #[test]
    fn malformed_metadata_is_an_error_not_a_panic() {
        let mut content = tiny_content("gpt-2");
        content.metadata.remove(KEY_TOKENS);
        assert!(build_err(&content).contains(KEY_TOKENS));

        let mut content = tiny_content("gpt-2");
        content.metadata.insert(
            KEY_MERGES.into(),
            Value::Array(vec![Value::String("nospace".into())]),
        );
        assert!(build_err(&content).contains("nospace"));

        let mut content = tiny_content("gpt-2");
        content.metadata.insert(
            KEY_MERGES.into(),
            Value::Array(vec![Value::String("Ġ zz".into())]),
        );
        let err = build_err(&content);
        assert!(err.contains("`zz` is not in the vocabulary"), "{err}");

        let mut content = tiny_content("gpt-2");
        content
            .metadata
            .insert(KEY_TYPES.into(), Value::Array(vec![Value::I32(1)]));
        assert!(build_err(&content).contains(KEY_TYPES));

        let mut content = tiny_content("gpt-2");
        content
            .metadata
            .insert(KEY_TOKENS.into(), Value::Array(vec![Value::U32(1)]));
        assert!(build_err(&content).contains("not a string"));
    }

    #[test]
    fn out_of_range_special_ids_are_ignored() {
        let mut content = tiny_content("gpt-2");
        content
            .metadata
            .insert("tokenizer.ggml.bos_token_id".into(), Value::U32(99_999));
        content
            .metadata
            .insert("tokenizer.ggml.eos_token_id".into(), Value::I32(-1));
        let tok = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
        assert_eq!(tok.bos_token_id(), None);
        assert_eq!(tok.eos_token_id(), None);
        // The end-of-turn tokens are still found by name.
        assert_eq!(tok.eos_token_ids(), &[2, 0]);
    }
}
