//! Rebuilds a SentencePiece tokenizer (`tokenizer.ggml.model = "llama"`: Llama 1/2, Mistral
//! v0.1, Phi-3, Gemma 1-3, ...) from GGUF metadata, reading the keys llama.cpp reads and
//! taking its defaults: tokens, scores and token types; BOS 1, EOS 2 and UNK 0 unless the file
//! names others; BOS added, EOS not; `tokenizer.ggml.add_space_prefix` true.
//!
//! Malformed vocabularies are refused here, at load, naming the key: missing scores, byte
//! tokens that do not cover all 256 bytes (text needing a missing one could not be encoded).

use crate::error::{Result, TokenizerError};
use crate::gguf_keys::{Metadata, KEY_ADD_BOS, KEY_ADD_EOS, KEY_TEMPLATE, KEY_TOKENS, KEY_TYPES};
use crate::parts::{Encoder, TokenizerParts};
use crate::spm::{SentencePiece, SpecialToken, ESCAPED_SPACE};
use crate::vocab::{TokenKind, TokenTable};

const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_NAME: &str = "general.name";

/// GGUF token types (llama.cpp's `llama_token_type`), which decide both how a token decodes
/// and whether it is cut out of text before merging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
    /// 0, or a number newer than this list: llama.cpp decodes it to nothing.
    Undefined,
}

impl TokenType {
    fn from_gguf(value: i64) -> Self {
        match value {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }

    fn kind(self) -> TokenKind {
        match self {
            Self::Unknown | Self::Control => TokenKind::Special,
            Self::UserDefined => TokenKind::Literal,
            Self::Normal | Self::Unused | Self::Byte | Self::Undefined => TokenKind::Normal,
        }
    }
}

/// What a SentencePiece vocabulary's keys say, validated: the tokens with their scores and
/// types, the unknown token and whether text gets a space prefix.
struct SpmVocab<'a> {
    tokens: Vec<&'a str>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    /// The byte each byte-type token stands for.
    byte_values: Vec<Option<u8>>,
    unk: Option<u32>,
    add_space_prefix: bool,
}

fn read_vocab<'a>(meta: &Metadata<'a>) -> Result<SpmVocab<'a>> {
    let tokens = meta.tokens()?;
    let n = tokens.len();
    // llama.cpp reads the first `n` entries of longer arrays, and so do we.
    let mut scores = meta.float_array(KEY_SCORES)?.ok_or_else(|| {
        meta.invalid(
            KEY_SCORES,
            "not present; a SentencePiece vocabulary merges by score",
        )
    })?;
    if scores.len() < n {
        return Err(meta.invalid(
            KEY_SCORES,
            &format!("{} scores for {n} tokens", scores.len()),
        ));
    }
    scores.truncate(n);
    let types: Vec<TokenType> = match meta.int_array(KEY_TYPES)? {
        Some(types) if types.len() >= n => types[..n]
            .iter()
            .map(|&t| TokenType::from_gguf(t))
            .collect(),
        Some(types) => {
            return Err(meta.invalid(KEY_TYPES, &format!("{} types for {n} tokens", types.len())))
        }
        None => vec![TokenType::Normal; n],
    };
    let byte_values = byte_token_values(meta, &tokens, &types)?;
    let unk = meta.token_id("unknown_token_id", n)?.or(default_id(0, n));
    let add_space_prefix = meta.optional_bool(KEY_ADD_SPACE_PREFIX)?.unwrap_or(true);
    Ok(SpmVocab {
        tokens,
        scores,
        types,
        byte_values,
        unk,
        add_space_prefix,
    })
}

/// llama.cpp's default for a special id, when the vocabulary has that many tokens.
fn default_id(id: u32, n: usize) -> Option<u32> {
    ((id as usize) < n).then_some(id)
}

pub(crate) fn build(meta: &Metadata) -> Result<TokenizerParts> {
    let SpmVocab {
        tokens,
        scores,
        types,
        byte_values,
        unk,
        add_space_prefix,
    } = read_vocab(meta)?;
    let n = tokens.len();
    let path = meta.path;
    // llama.cpp's defaults for these vocabularies, which a named id in range replaces.
    let bos = meta.token_id("bos_token_id", n)?.or(default_id(1, n));
    let eos = meta.token_id("eos_token_id", n)?.or(default_id(2, n));
    let pad = meta.token_id("padding_token_id", n)?;
    let extra_eog: Vec<u32> = [
        meta.token_id("eot_token_id", n)?,
        meta.token_id("eom_token_id", n)?,
    ]
    .into_iter()
    .flatten()
    .collect();
    let add_bos = meta.optional_bool(KEY_ADD_BOS)?.unwrap_or(true);
    let add_eos = meta.optional_bool(KEY_ADD_EOS)?.unwrap_or(false);
    let chat_template = meta.optional_str(KEY_TEMPLATE)?.map(str::to_string);

    let table = TokenTable::with_bytes(
        tokens
            .iter()
            .zip(&types)
            .map(|(text, t)| (Some(text.to_string()), t.kind()))
            .collect(),
        |id, text, _, out| match types[id] {
            TokenType::Normal => unescape_spaces(text, out),
            TokenType::Byte => out.extend(byte_values[id]),
            TokenType::Unknown | TokenType::Control | TokenType::UserDefined => {
                out.extend_from_slice(text.as_bytes())
            }
            // llama.cpp's `token_to_piece` writes nothing for these.
            TokenType::Unused | TokenType::Undefined => {}
        },
    );

    let byte_fallback = byte_fallback(&tokens);
    let specials = special_tokens(meta, &tokens, &types)?;
    let spm = SentencePiece::new(
        &tokens,
        &scores,
        byte_fallback,
        unk,
        add_space_prefix,
        specials,
    )
    .map_err(|reason| TokenizerError::Build {
        path: path.to_path_buf(),
        reason,
    })?;
    Ok(TokenizerParts {
        encoder: Encoder::SentencePiece(Box::new(spm)),
        table,
        bos,
        eos,
        pad,
        extra_eog,
        add_bos,
        add_eos,
        // llama.cpp's `detokenize` drops the space the encoding prefixed from a text's first
        // token; see `Tokenizer::decode`.
        strip_first_space: add_space_prefix,
        chat_template,
    })
}

/// A SentencePiece vocabulary as a Hugging Face `tokenizer.json`, the way transformers
/// converts one (its `SpmConverter`): a BPE model with byte fallback whose merges are every
/// split of a normal piece into two normal pieces, ranked by the merged piece's score (the
/// highest first, as SentencePiece merges); the space prefix as a `Prepend("▁")` normalizer,
/// which runs on each stretch of text between special tokens as llama.cpp prefixes each
/// fragment after one; control, unknown and user-defined tokens as added tokens cut out before
/// normalization. The vocabulary is validated as [`build`] validates it.
pub(crate) fn to_hf_json(meta: &Metadata) -> Result<String> {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::normalizers::{Prepend, Replace, Sequence};
    use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper};

    let SpmVocab {
        tokens,
        scores,
        types,
        unk,
        add_space_prefix,
        ..
    } = read_vocab(meta)?;
    let path = meta.path;
    let err = |reason: String| TokenizerError::Build {
        path: path.to_path_buf(),
        reason,
    };
    let n = tokens.len();

    let normal: ahash::AHashMap<&str, u32> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, t))| **t == TokenType::Normal)
        .map(|(id, (text, _))| (*text, id as u32))
        .collect();
    // (merged piece's score, merged id, left id) orders the merges: SentencePiece merges the
    // adjacent pair whose union scores highest.
    let mut ranked: Vec<(f32, u32, u32, &str, &str)> = Vec::new();
    for (&piece, &id) in &normal {
        for (cut, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(cut);
            if let (Some(&l), Some(_)) = (normal.get(left), normal.get(right)) {
                ranked.push((scores[id as usize], id, l, left, right));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<(String, String)> = ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect();
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.to_string(), id as u32))
        .collect();
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        bpe = bpe.unk_token(tokens[unk as usize].to_string());
    }
    let mut hf = tokenizers::Tokenizer::new(bpe.build().map_err(|e| err(e.to_string()))?);
    let space = Replace::new(" ", ESCAPED_SPACE).map_err(|e| err(e.to_string()))?;
    let mut steps: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        steps.push(Prepend::new(ESCAPED_SPACE.to_string()).into());
    }
    steps.push(space.into());
    hf.with_normalizer(Some(Sequence::new(steps)));
    let unescape = tokenizers::decoders::sequence::Sequence::new(vec![
        DecoderWrapper::Replace(
            Replace::new(ESCAPED_SPACE.to_string(), " ").map_err(|e| err(e.to_string()))?,
        ),
        DecoderWrapper::ByteFallback(tokenizers::decoders::byte_fallback::ByteFallback::new()),
        DecoderWrapper::Fuse(tokenizers::decoders::fuse::Fuse::new()),
    ]);
    hf.with_decoder(Some(unescape));
    let added = |kind: TokenKind| -> Vec<AddedToken> {
        (0..n)
            .filter(|&id| types[id].kind() == kind)
            .map(|id| {
                AddedToken::from(tokens[id].to_string(), kind == TokenKind::Special)
                    .normalized(false)
            })
            .collect()
    };
    hf.add_special_tokens(&added(TokenKind::Special));
    hf.add_tokens(&added(TokenKind::Literal));
    hf.to_string(false).map_err(|e| err(e.to_string()))
}

/// The byte each byte-type token stands for (`None` for other tokens). Every byte token must be
/// spelled `<0xAB>`, and when a vocabulary has byte tokens at all they must cover all 256
/// bytes: SentencePiece's byte fallback relies on them, and a gap would leave some text without
/// any encoding.
fn byte_token_values(
    meta: &Metadata,
    tokens: &[&str],
    types: &[TokenType],
) -> Result<Vec<Option<u8>>> {
    let mut values = vec![None; tokens.len()];
    let mut seen = [false; 256];
    let mut any = false;
    for (id, (text, t)) in tokens.iter().zip(types).enumerate() {
        if *t != TokenType::Byte {
            continue;
        }
        let byte = parse_byte_token(text).ok_or_else(|| {
            meta.invalid(
                KEY_TOKENS,
                &format!("token {id} `{text}` has the byte type but is not spelled <0xAB>"),
            )
        })?;
        values[id] = Some(byte);
        seen[byte as usize] = true;
        any = true;
    }
    if let Some(missing) = seen.iter().position(|s| !s).filter(|_| any) {
        let count = seen.iter().filter(|s| !**s).count();
        return Err(meta.invalid(
            KEY_TOKENS,
            &format!(
                "the vocabulary has byte tokens but not <0x{missing:02X}> ({count} of 256 bytes \
                 missing); byte fallback needs all of them"
            ),
        ));
    }
    Ok(values)
}

/// `<0xAB>` as the byte 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// What each byte of a character the vocabulary lacks becomes, as llama.cpp's `byte_to_token`
/// finds it: the token spelled `<0xAB>` (uppercase, whatever its type), else the byte itself
/// as a one-character token. (Where neither exists llama.cpp throws; the encoder gives the
/// unknown token.)
fn byte_fallback(tokens: &[&str]) -> [Option<u32>; 256] {
    let mut by_text = ahash::AHashMap::with_capacity(tokens.len());
    for (id, text) in tokens.iter().enumerate() {
        by_text.insert(*text, id as u32);
    }
    std::array::from_fn(|byte| {
        let spelled = format!("<0x{byte:02X}>");
        let single = (byte < 0x80).then(|| char::from(byte as u8).to_string());
        by_text
            .get(spelled.as_str())
            .or_else(|| single.as_deref().and_then(|s| by_text.get(s)))
            .copied()
    })
}

/// The tokens cut out of text before merging: control, unknown and user-defined ones
/// (llama.cpp's `cache_special_tokens`), with the whitespace-stripping llama.cpp gives
/// Phi-3's by model name (`general.name`), since GGUF carries no per-token attributes.
fn special_tokens(
    meta: &Metadata,
    tokens: &[&str],
    types: &[TokenType],
) -> Result<Vec<SpecialToken>> {
    let name = meta.optional_str(KEY_NAME)?.unwrap_or("").to_lowercase();
    let phi3 = name.contains("phi-3") || name.contains("phi3");
    Ok(tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, t))| {
            matches!(
                t,
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined
            )
        })
        .map(|(id, (text, _))| SpecialToken {
            id: id as u32,
            text: text.to_string(),
            lstrip: false,
            rstrip: phi3 && !matches!(*text, "<unk>" | "<s>" | "<|endoftext|>"),
        })
        .collect())
}

/// A normal piece's bytes: its text with each `▁` a space.
fn unescape_spaces(text: &str, out: &mut Vec<u8>) {
    for (i, part) in text.split(ESCAPED_SPACE).enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(part.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::gguf_metadata::{MetadataMap, MetadataValue as V};
    use crate::testing::tiny_spm_metadata;
    use crate::{Tokenizer, TokenizerError};

    fn error(metadata: &MetadataMap) -> TokenizerError {
        match Tokenizer::from_gguf(metadata, Path::new("spm.gguf")) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    /// The key a metadata error names, and its reason.
    fn bad_key(metadata: &MetadataMap) -> (String, String) {
        match error(metadata) {
            TokenizerError::Metadata { key, reason, .. } => (key, reason),
            other => panic!("not a metadata error: {other}"),
        }
    }

    #[test]
    fn tiny_vocabulary_builds_with_llama_cpp_defaults() {
        let tok = Tokenizer::from_gguf(&tiny_spm_metadata(true), Path::new("spm.gguf")).unwrap();
        assert_eq!((tok.bos_token_id(), tok.eos_token_id()), (Some(1), Some(2)));
        assert!(tok.add_bos_token() && !tok.add_eos_token());
        assert_eq!(tok.encode_prompt("hi").unwrap(), vec![1, 263]);
        assert_eq!(tok.decode(&[263], false), "hi");
        let mut m = tiny_spm_metadata(true);
        m.insert("tokenizer.ggml.add_space_prefix", V::Bool(false));
        let tok = Tokenizer::from_gguf(&m, Path::new("spm.gguf")).unwrap();
        assert_eq!(tok.encode("hi").unwrap(), vec![260, 261]);
        assert_eq!(tok.encode(" hi").unwrap(), vec![263]);
        assert_eq!(
            tok.decode(&[263], false),
            " hi",
            "no prefix, nothing stripped"
        );
    }

    #[test]
    fn missing_or_short_scores_are_refused_by_key() {
        let mut m = tiny_spm_metadata(true);
        m.remove("tokenizer.ggml.scores");
        let (key, reason) = bad_key(&m);
        assert_eq!(key, "tokenizer.ggml.scores");
        assert!(reason.contains("not present"), "{reason}");
        let e = error(&m).to_string();
        assert!(
            e.contains("spm.gguf") && e.contains("tokenizer.ggml.scores"),
            "{e}"
        );

        m.insert("tokenizer.ggml.scores", V::floats([0.0, 1.0]));
        let (key, reason) = bad_key(&m);
        assert_eq!(key, "tokenizer.ggml.scores");
        assert!(reason.contains("2 scores for 264 tokens"), "{reason}");

        m.insert("tokenizer.ggml.scores", V::strings(["x"]));
        assert_eq!(bad_key(&m).0, "tokenizer.ggml.scores");
    }

    #[test]
    fn a_gap_in_the_byte_tokens_is_refused() {
        let mut m = tiny_spm_metadata(true);
        // <0x41> (id 3 + 0x41) spelled as a piece: the byte tokens no longer cover 0x41.
        if let Some(V::Array(tokens)) = m.get_mut("tokenizer.ggml.tokens") {
            tokens[3 + 0x41] = V::String("A".into());
        }
        if let Some(V::Array(types)) = m.get_mut("tokenizer.ggml.token_type") {
            types[3 + 0x41] = V::Int(1);
        }
        let (key, reason) = bad_key(&m);
        assert_eq!(key, "tokenizer.ggml.tokens");
        assert!(
            reason.contains("<0x41>") && reason.contains("1 of 256"),
            "{reason}"
        );

        // A byte-type token that is not spelled <0xAB>.
        let mut m = tiny_spm_metadata(true);
        if let Some(V::Array(tokens)) = m.get_mut("tokenizer.ggml.tokens") {
            tokens[3] = V::String("<0xZZ>".into());
        }
        let (key, reason) = bad_key(&m);
        assert_eq!(key, "tokenizer.ggml.tokens");
        assert!(reason.contains("token 3 `<0xZZ>`"), "{reason}");
    }

    #[test]
    fn an_unknown_tokenizer_model_is_refused_by_key() {
        let mut m = tiny_spm_metadata(true);
        m.insert("tokenizer.ggml.model", V::String("gemma4".into()));
        match error(&m) {
            TokenizerError::Unsupported { what, .. } => {
                assert!(what.contains("`gemma4` (tokenizer.ggml.model)"), "{what}")
            }
            other => panic!("not unsupported: {other}"),
        }
        m.remove("tokenizer.ggml.model");
        assert_eq!(bad_key(&m).0, "tokenizer.ggml.model");
    }

    #[test]
    fn mismatched_token_types_are_refused_by_key() {
        let mut m = tiny_spm_metadata(true);
        m.insert("tokenizer.ggml.token_type", V::ints([1, 1]));
        assert_eq!(bad_key(&m).0, "tokenizer.ggml.token_type");
    }

    #[test]
    fn unused_tokens_decode_to_nothing_and_control_tokens_are_skippable() {
        let mut m = tiny_spm_metadata(true);
        if let Some(V::Array(types)) = m.get_mut("tokenizer.ggml.token_type") {
            types[260] = V::Int(5);
        }
        let tok = Tokenizer::from_gguf(&m, Path::new("spm.gguf")).unwrap();
        assert_eq!(tok.token_bytes(260), b"");
        assert_eq!(tok.decode(&[1, 263, 2], false), "<s> hi</s>");
        assert_eq!(tok.decode(&[1, 263, 2], true), " hi");
    }
}
