//! Loads a Hugging Face `tokenizer.json` (plus the `tokenizer_config.json` beside it, when
//! present, for BOS/EOS, `add_bos_token` and the chat template).

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{Result, TokenizerError};
use crate::parts::{Encoder, TokenizerParts};
use crate::vocab::{PieceEncoding, TokenKind, TokenTable};

pub(crate) fn build(path: &Path) -> Result<TokenizerParts> {
    let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Build {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let encoding = piece_encoding(&inner).ok_or_else(|| TokenizerError::Unsupported {
        path: path.to_path_buf(),
        what: "tokenizer decoder (supported: ByteLevel, or SentencePiece-style \
               Metaspace/Replace(\u{2581})/ByteFallback)"
            .to_string(),
    })?;

    let vocab = inner.get_vocab(true);
    let added = inner.get_added_tokens_decoder();
    let size = vocab.values().max().map_or(0, |&max| max as usize + 1);
    let mut entries: Vec<(Option<String>, TokenKind)> = vec![(None, TokenKind::Normal); size];
    for (text, id) in vocab {
        let kind = match added.get(&id) {
            Some(token) if token.special => TokenKind::Special,
            Some(_) => TokenKind::Literal,
            None => TokenKind::Normal,
        };
        entries[id as usize] = (Some(text), kind);
    }
    let table = TokenTable::new(entries, encoding);

    let config = TokenizerConfig::read(path)?;
    let id_of = |token: &Option<String>| token.as_deref().and_then(|t| inner.token_to_id(t));
    // The special token the post-processor puts in front of a sequence, if any: that is how
    // a tokenizer.json says "this model wants BOS" when no config says so.
    let prepended = inner
        .encode_fast("", true)
        .ok()
        .and_then(|e| e.get_ids().first().copied())
        .filter(|&id| table.kind(id) == Some(TokenKind::Special));
    let bos = id_of(&config.bos_token).or(prepended);
    let add_bos = config
        .add_bos_token
        .unwrap_or(prepended.is_some() && prepended == bos);
    // Likewise at the end: the special token the post-processor appends, if it is EOS.
    let eos = id_of(&config.eos_token);
    let appended = inner
        .encode_fast("", true)
        .ok()
        .and_then(|e| e.get_ids().last().copied())
        .filter(|&id| table.kind(id) == Some(TokenKind::Special));
    let add_eos = config
        .add_eos_token
        .unwrap_or(appended.is_some() && appended == eos);
    Ok(TokenizerParts {
        bos,
        eos,
        pad: id_of(&config.pad_token),
        extra_eog: Vec::new(),
        add_bos,
        add_eos,
        // The `Strip` decoder step this would mirror is not applied (see `Tokenizer::from_file`).
        strip_first_space: false,
        chat_template: config.chat_template,
        encoder: Encoder::HuggingFace(Box::new(inner)),
        table,
    })
}

/// Which piece spelling the tokenizer's decoder undoes, found by the decoder types it chains.
fn piece_encoding(inner: &tokenizers::Tokenizer) -> Option<PieceEncoding> {
    let decoder = serde_json::to_value(inner.get_decoder()?).ok()?;
    let mut types = Vec::new();
    collect_types(&decoder, &mut types);
    if types.contains(&"ByteLevel") {
        Some(PieceEncoding::ByteLevel)
    } else if types
        .iter()
        .any(|t| matches!(*t, "Metaspace" | "ByteFallback" | "Replace"))
    {
        Some(PieceEncoding::SentencePiece)
    } else {
        None
    }
}

fn collect_types<'a>(value: &'a Json, out: &mut Vec<&'a str>) {
    match value {
        Json::Object(map) => {
            if let Some(Json::String(t)) = map.get("type") {
                out.push(t);
            }
            map.values().for_each(|v| collect_types(v, out));
        }
        Json::Array(items) => items.iter().for_each(|v| collect_types(v, out)),
        _ => {}
    }
}

/// The parts of `tokenizer_config.json` that matter for serving.
#[derive(Default)]
struct TokenizerConfig {
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    add_bos_token: Option<bool>,
    add_eos_token: Option<bool>,
    chat_template: Option<String>,
}

impl TokenizerConfig {
    /// Reads `tokenizer_config.json` next to `tokenizer_json`; absent is fine, malformed is not.
    fn read(tokenizer_json: &Path) -> Result<Self> {
        let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
        let path = dir.join("tokenizer_config.json");
        let mut config = if path.exists() {
            let text = std::fs::read_to_string(&path).map_err(|source| TokenizerError::Io {
                path: path.clone(),
                source,
            })?;
            let json: Json = serde_json::from_str(&text).map_err(|e| TokenizerError::Build {
                path: path.clone(),
                reason: format!("invalid JSON: {e}"),
            })?;
            Self {
                bos_token: token_text(json.get("bos_token")),
                eos_token: token_text(json.get("eos_token")),
                pad_token: token_text(json.get("pad_token")),
                add_bos_token: json.get("add_bos_token").and_then(Json::as_bool),
                add_eos_token: json.get("add_eos_token").and_then(Json::as_bool),
                chat_template: template_text(json.get("chat_template")),
            }
        } else {
            Self::default()
        };
        // Newer checkpoints keep the template in its own file.
        if config.chat_template.is_none() {
            let jinja = dir.join("chat_template.jinja");
            if jinja.exists() {
                config.chat_template =
                    Some(
                        std::fs::read_to_string(&jinja).map_err(|source| TokenizerError::Io {
                            path: jinja,
                            source,
                        })?,
                    );
            }
        }
        Ok(config)
    }
}

/// A special token in tokenizer_config.json is either its text or `{"content": text, ...}`.
fn token_text(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which `default` is the one
/// for plain chat.
fn template_text(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Array(items) => items
            .iter()
            .find(|item| item.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|item| item.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    }
}
