//! Text <-> token ids for a model: built from a GGUF file's `tokenizer.ggml.*` metadata or from a
//! Hugging Face `tokenizer.json`.
//!
//! GGUF vocabularies are encoded by our own encoders: byte-level BPE by `bpe` and the
//! `pretokenize` scanners (about ten times faster than the `tokenizers` crate, and checked
//! against it in the tests), SentencePiece by `spm` (checked against llama.cpp's own test
//! vocabularies and their expected ids). A `tokenizer.json` is encoded by `tokenizers` itself, since it may declare any
//! normalizer or model. Decoding goes through neither: every id has a precomputed byte string
//! ([`Tokenizer::token_bytes`]), and decoding concatenates those bytes and reads them as lossy
//! UTF-8. The streaming [`IncrementalDecoder`](crate::detokenizer::IncrementalDecoder) uses the
//! same bytes, so a streamed response is exactly the text of decoding all its ids at once.

use std::path::Path;

use crate::error::Result;
use crate::gguf_metadata::GgufMetadata;
use crate::parts::{Encoder, TokenizerParts};
use crate::vocab::{TokenKind, TokenTable};
use crate::{gguf_vocab, hf_json, pretokenize};

/// Texts of tokens that end a turn or a document in the model families we serve. When such a
/// token exists as a special (added) token it is a stop id, whatever the file names as EOS:
/// SmolLM2 and Qwen end chat turns with `<|im_end|>` but documents with `<|endoftext|>`, Llama 3
/// uses `<|eot_id|>`/`<|eom_id|>` beside `<|end_of_text|>`, Gemma `<end_of_turn>`. This mirrors
/// llama.cpp's end-of-generation token set.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<EOT>",
];

/// A model's tokenizer: encoding, decoding, special ids and the chat template source.
pub struct Tokenizer {
    encoder: Encoder,
    table: TokenTable,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    strip_first_space: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata: byte-level
    /// BPE (`tokenizer.ggml.model = "gpt2"`; see [`SUPPORTED_PRE_TOKENIZERS`] for the
    /// pre-tokenizers) or SentencePiece (`"llama"`), each encoding as llama.cpp does. `path` is
    /// only used in errors.
    pub fn from_gguf(metadata: &dyn GgufMetadata, path: &Path) -> Result<Self> {
        gguf_vocab::build(metadata, path).map(Self::assemble)
    }

    /// Loads a Hugging Face `tokenizer.json`. BOS/EOS, `add_bos_token` and the chat template
    /// come from a `tokenizer_config.json` beside it when there is one (else `chat_template.jinja`
    /// for the template); without it, BOS is whatever special token the file's post-processor
    /// prepends, and there is no EOS besides the well-known end-of-turn tokens.
    ///
    /// Decoding understands byte-level decoders and SentencePiece-style ones (`▁` as space,
    /// `<0xAB>` byte pieces). A decoder's position-dependent steps are not applied: a
    /// SentencePiece `Strip` of the first leading space, for instance, is left out, so a
    /// Llama 2 style text decodes with the space its dummy prefix added.
    pub fn from_file(path: &Path) -> Result<Self> {
        hf_json::build(path).map(Self::assemble)
    }

    /// The tokenizer a GGUF file describes, written as a Hugging Face `tokenizer.json`: for a
    /// byte-level BPE vocabulary (`gpt2`) its merges, the pre-tokenizer `tokenizer.ggml.pre`
    /// names and ByteLevel decoding; for a SentencePiece one (`llama`) merges ranked by its
    /// scores, byte fallback and the space prefix, as transformers converts one. Control
    /// tokens become special added tokens. [`Tokenizer::from_file`] on it encodes as
    /// [`Tokenizer::from_gguf`] does. `path` is only used in errors.
    pub fn hf_json_from_gguf(metadata: &dyn GgufMetadata, path: &Path) -> Result<String> {
        gguf_vocab::to_hf_json(metadata, path)
    }

    fn assemble(parts: TokenizerParts) -> Self {
        let TokenizerParts {
            encoder,
            table,
            bos,
            eos,
            pad,
            extra_eog,
            add_bos,
            add_eos,
            strip_first_space,
            chat_template,
        } = parts;
        let mut eos_ids: Vec<u32> = eos.into_iter().chain(extra_eog).collect();
        for text in END_OF_GENERATION_TEXTS {
            if let Some(id) = encoder.token_to_id(text) {
                if matches!(
                    table.kind(id),
                    Some(TokenKind::Special | TokenKind::Literal)
                ) {
                    eos_ids.push(id);
                }
            }
        }
        let is_control = |text: &str| {
            encoder
                .token_to_id(text)
                .filter(|&id| table.kind(id) == Some(TokenKind::Special))
        };
        if let (Some(ret), Some(call)) = (is_control("<|return|>"), is_control("<|call|>")) {
            // Harmony (gpt-oss): a turn ends with `<|return|>` after the answer or `<|call|>`
            // after a tool call, while `<|end|>` only closes one message of several (the
            // reasoning before the answer), so it must not stop generation. llama.cpp does
            // the same for this vocabulary.
            eos_ids.extend([ret, call]);
            if let Some(end) = is_control("<|end|>") {
                eos_ids.retain(|&id| id != end);
            }
        }
        let mut seen = std::collections::HashSet::new();
        eos_ids.retain(|id| seen.insert(*id));
        Self {
            encoder,
            table,
            bos,
            eos,
            pad,
            eos_ids,
            add_bos,
            add_eos,
            strip_first_space,
            chat_template,
        }
    }

    /// Token ids of `text`, with special tokens (`<|im_start|>`) parsed as single ids and no
    /// BOS added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encoder.encode(text)
    }

    /// Token ids of a prompt as the model expects to see it: [`encode`](Self::encode), with BOS
    /// prepended when the model wants one ([`add_bos_token`](Self::add_bos_token)) and the text
    /// does not already start with it (a chat template may render BOS itself).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Token ids of a whole input as the model's tokenizer frames it (an embedding input):
    /// [`encode_prompt`](Self::encode_prompt), then EOS appended when the model wants one
    /// ([`add_eos_token`](Self::add_eos_token)) and the text does not already end with it.
    pub fn encode_input(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_prompt(text)?;
        if let (true, Some(eos)) = (self.add_eos, self.eos) {
            if ids.last() != Some(&eos) {
                ids.push(eos);
            }
        }
        Ok(ids)
    }

    /// Text of `ids`: their bytes concatenated and read as UTF-8, invalid sequences replaced by
    /// U+FFFD. Ids outside the vocabulary contribute nothing (callers that take ids from users
    /// check them against [`vocab_size`](Self::vocab_size)).
    ///
    /// `ids` are a whole text: for a GGUF SentencePiece vocabulary, the first id's bytes lose
    /// one leading space, the one the encoding put in front (llama.cpp's `detokenize`: so
    /// `decode(encode(x)) == x`). As there, this is the first id whatever it is: ids that start
    /// with BOS keep the space after it. The [`IncrementalDecoder`](crate::IncrementalDecoder)
    /// decodes a continuation (generated ids) and strips nothing.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            if skip_special_tokens && self.is_special(id) {
                continue;
            }
            let piece = self.token_bytes(id);
            let piece = match piece.split_first() {
                Some((b' ', rest)) if i == 0 && self.strip_first_space => rest,
                _ => piece,
            };
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes `id` stands for: for byte-level BPE the token's characters mapped back
    /// through GPT-2's byte alphabet (a fragment of a UTF-8 character is possible); for
    /// SentencePiece the piece with `▁` as a space, or a byte token's one byte; for special
    /// and added tokens their literal text. Empty for an id outside the vocabulary (and for a
    /// SentencePiece vocabulary's unused tokens, as in llama.cpp).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.table.bytes_of(id)
    }

    /// Whether `id` is a control token (BOS/EOS, `<|im_start|>`, UNK): the ones
    /// `skip_special_tokens` drops. User-defined added tokens are not special.
    pub fn is_special(&self, id: u32) -> bool {
        self.table.kind(id) == Some(TokenKind::Special)
    }

    /// The vocabulary text of `id`, in the vocabulary's own spelling (`Ġhello` for " hello").
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.table.texts.get(id as usize)?.as_deref()
    }

    /// The id whose vocabulary text is exactly `token`, in the vocabulary's own spelling.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.encoder.token_to_id(token)
    }

    /// Number of ids the tokenizer knows, added tokens included. A model's embedding can be
    /// larger (padded); ids at or above this decode to nothing.
    pub fn vocab_size(&self) -> usize {
        self.table.len()
    }

    /// Where `other` reads token ids differently from this tokenizer, in words; `None` when
    /// every id stands for the same bytes and the same kind of token in both (what a draft
    /// model must share with its target: the engine hands ids from one to the other).
    pub fn vocabulary_difference(&self, other: &Tokenizer) -> Option<String> {
        if self.vocab_size() != other.vocab_size() {
            return Some(format!(
                "{} tokens against {}",
                self.vocab_size(),
                other.vocab_size()
            ));
        }
        let id = (0..self.vocab_size() as u32).find(|&id| {
            self.token_bytes(id) != other.token_bytes(id)
                || self.table.kind(id) != other.table.kind(id)
        })?;
        let text = |t: &Tokenizer| format!("{:?}", t.id_to_token(id).unwrap_or(""));
        Some(format!(
            "token {id} is {} against {}",
            text(self),
            text(other)
        ))
    }

    /// Whether prompts should start with BOS (GGUF `tokenizer.ggml.add_bos_token`, defaulting
    /// as llama.cpp does: true for the Llama 3 pre-tokenizer and SentencePiece, false for other
    /// BPE vocabularies).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Whether whole inputs end with EOS (GGUF `tokenizer.ggml.add_eos_token`, default false;
    /// `add_eos_token` or the post-processor of a Hugging Face tokenizer).
    pub fn add_eos_token(&self) -> bool {
        self.add_eos
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad
    }

    /// Every id that ends generation: the EOS id first, then ids the file names as end of turn
    /// or end of message (GGUF `tokenizer.ggml.eot_token_id`/`eom_token_id`), then whichever of
    /// `<|im_end|>`, `<|endoftext|>`, `<|end_of_text|>`, `<|eot_id|>`, `<|eom_id|>`,
    /// `<end_of_turn>`, `<|end|>`, `<EOT>` exist as special or added tokens. No duplicates.
    /// For SmolLM2 this is `[2 (<|im_end|>), 0 (<|endoftext|>)]`.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Makes `ids` end generation too (a Hugging Face `generation_config.json` may list several
    /// EOS ids); the first becomes the EOS id when the tokenizer had none. Ids already stop
    /// ids, or outside the vocabulary, are skipped.
    pub fn add_eos_token_ids(&mut self, ids: impl IntoIterator<Item = u32>) {
        for id in ids {
            if (id as usize) < self.vocab_size() && !self.eos_ids.contains(&id) {
                self.eos_ids.push(id);
                self.eos.get_or_insert(id);
            }
        }
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.id_to_token(self.bos?)
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.id_to_token(self.eos?)
    }

    /// The Jinja chat template the model ships (GGUF `tokenizer.chat_template`).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// `tokenizer.ggml.pre` names [`Tokenizer::from_gguf`] understands.
pub const SUPPORTED_PRE_TOKENIZERS: &[&str] = pretokenize::SUPPORTED_NAMES;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf_metadata::MetadataValue;
    use crate::testing::tiny_metadata;

    fn tiny_tokenizer() -> Tokenizer {
        Tokenizer::from_gguf(&tiny_metadata("gpt-2"), Path::new("tiny.gguf")).unwrap()
    }

    #[test]
    fn harmony_turns_end_at_return_or_call_and_not_at_end() {
        let tok = Tokenizer::from_gguf(
            &crate::testing::tiny_harmony_metadata(),
            Path::new("harmony.gguf"),
        )
        .unwrap();
        let id = |t: &str| tok.token_to_id(t).unwrap();
        let mut eos = tok.eos_token_ids().to_vec();
        eos.sort();
        let mut want = ["<|return|>", "<|call|>", "<|endoftext|>", "<|im_end|>"].map(id);
        want.sort();
        assert_eq!(eos, want);
        assert_eq!(
            tok.eos_token_ids()[0],
            id("<|return|>"),
            "the file's EOS comes first"
        );
        // The control tokens are text when not skipped: the Harmony parser reads them.
        let ids = tok.encode("<|channel|>final<|message|>hi").unwrap();
        assert_eq!(ids[0], id("<|channel|>"));
        assert_eq!(tok.decode(&ids, false), "<|channel|>final<|message|>hi");
        assert_eq!(tok.decode(&ids, true), "finalhi");
    }

    #[test]
    fn vocabularies_differ_by_size_by_a_token_or_by_a_kind() {
        let tok = tiny_tokenizer();
        assert_eq!(tok.vocabulary_difference(&tiny_tokenizer()), None);
        // The pre-tokenizer is not the vocabulary: ids still mean the same bytes.
        let other = Tokenizer::from_gguf(&tiny_metadata("qwen2"), Path::new("q.gguf")).unwrap();
        assert_eq!(tok.vocabulary_difference(&other), None);
        // tiny_metadata's vocabulary, edited.
        let changed = |edit: &dyn Fn(&mut Vec<String>, &mut Vec<i32>)| {
            let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
                .map(String::from)
                .to_vec();
            tokens.extend((0..=255u8).map(|b| crate::testing::byte_char(b).to_string()));
            tokens.extend(["Ġt", "he", "Ġthe"].map(String::from));
            let mut types = vec![3i32; 3];
            types.resize(tokens.len(), 1);
            edit(&mut tokens, &mut types);
            let mut m = tiny_metadata("gpt-2");
            m.insert("tokenizer.ggml.tokens", MetadataValue::strings(tokens));
            m.insert("tokenizer.ggml.token_type", MetadataValue::ints(types));
            Tokenizer::from_gguf(&m, Path::new("other.gguf")).unwrap()
        };
        assert_eq!(tok.vocabulary_difference(&changed(&|_, _| {})), None);
        let longer = changed(&|t, k| {
            t.push("<extra>".into());
            k.push(3);
        });
        assert_eq!(
            tok.vocabulary_difference(&longer).as_deref(),
            Some("262 tokens against 263")
        );
        let swapped = changed(&|t, _| t.swap(100, 101));
        let d = tok.vocabulary_difference(&swapped).unwrap();
        assert!(d.starts_with("token 100 is "), "{d}");
        let kind = changed(&|_, k| k[0] = 1);
        assert!(tok
            .vocabulary_difference(&kind)
            .unwrap()
            .starts_with("token 0 "));
    }

    #[test]
    fn tiny_vocabulary_encodes_with_merges_and_special_tokens() {
        let tok = tiny_tokenizer();
        assert_eq!(tok.vocab_size(), 262);
        let ids = tok.encode("<|im_start|> the").unwrap();
        assert_eq!(ids, vec![1, 261]);
        assert_eq!(tok.decode(&ids, false), "<|im_start|> the");
        assert_eq!(tok.decode(&ids, true), " the");
        assert_eq!(tok.token_bytes(261), b" the");
        assert_eq!(tok.id_to_token(261), Some("Ġthe"));
        assert_eq!(tok.eos_token_ids(), &[2, 0]);
        assert_eq!(tok.bos_token(), Some("<|im_start|>"));
        assert!(!tok.add_bos_token());
        assert_eq!(tok.encode_prompt("he").unwrap(), tok.encode("he").unwrap());
    }

    #[test]
    fn tokenizer_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Tokenizer>();
    }

    #[test]
    fn out_of_range_ids_decode_to_nothing() {
        let tok = tiny_tokenizer();
        assert_eq!(tok.token_bytes(100_000), b"");
        assert_eq!(tok.decode(&[u32::MAX, 261], false), " the");
        assert!(!tok.is_special(u32::MAX));
        assert_eq!(tok.id_to_token(u32::MAX), None);
    }

    #[test]
    fn add_bos_token_prepends_bos_once() {
        let mut metadata = tiny_metadata("gpt-2");
        metadata.insert("tokenizer.ggml.add_bos_token", MetadataValue::Bool(true));
        let tok = Tokenizer::from_gguf(&metadata, Path::new("tiny.gguf")).unwrap();
        assert_eq!(tok.encode_prompt("he").unwrap(), vec![1, 260]);
        assert_eq!(tok.encode_prompt("<|im_start|>he").unwrap(), vec![1, 260]);
    }
}
