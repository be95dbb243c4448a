//! Tiny vocabularies (byte-level BPE, SentencePiece) built in memory, for tests that need a real
//! [`Tokenizer`](crate::tokenizer::Tokenizer) without a model file; compiled for this crate's
//! tests and with the `testing` feature.

use crate::byte_level::ByteLevelAlphabet;
use crate::gguf_metadata::{MetadataMap, MetadataValue};

/// GGUF tokenizer metadata of a vocabulary with `<|endoftext|>` (0), `<|im_start|>` (1),
/// `<|im_end|>` (2), all 256 byte characters (ids 3..259), and merges building "Ġt", "he",
/// "Ġthe" (ids 259..262), pre-tokenized by `pre`. BOS is 1, EOS 2.
pub fn tiny_metadata(pre: &str) -> MetadataMap {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut types = vec![3i32, 3, 3];
    let alphabet = ByteLevelAlphabet::new();
    for byte in 0..=255u8 {
        tokens.push(alphabet.char_of(byte).to_string());
        types.push(1);
    }
    for merged in ["Ġt", "he", "Ġthe"] {
        tokens.push(merged.to_string());
        types.push(1);
    }
    let mut metadata = MetadataMap::new();
    metadata.insert("tokenizer.ggml.model", MetadataValue::String("gpt2".into()));
    metadata.insert("tokenizer.ggml.pre", MetadataValue::String(pre.into()));
    metadata.insert("tokenizer.ggml.tokens", MetadataValue::strings(tokens));
    metadata.insert("tokenizer.ggml.token_type", MetadataValue::ints(types));
    metadata.insert(
        "tokenizer.ggml.merges",
        MetadataValue::strings(["Ġ t", "h e", "Ġt he"]),
    );
    metadata.insert("tokenizer.ggml.bos_token_id", MetadataValue::Int(1));
    metadata.insert("tokenizer.ggml.eos_token_id", MetadataValue::Int(2));
    metadata
}

/// The Harmony control tokens (gpt-oss), in the order [`tiny_harmony_metadata`] gives them ids.
pub const HARMONY_TOKENS: [&str; 7] = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
];

/// [`tiny_metadata`] (pre-tokenized as `gpt-4o`) with [`HARMONY_TOKENS`] as control tokens at
/// ids 262..269, and `<|return|>` (267) as EOS, as gpt-oss's vocabulary has them.
pub fn tiny_harmony_metadata() -> MetadataMap {
    let mut metadata = tiny_metadata("gpt-4o");
    let tokens = HARMONY_TOKENS.map(|t| MetadataValue::String(t.into()));
    let types = HARMONY_TOKENS.map(|_| MetadataValue::Int(3));
    for (key, added) in [
        ("tokenizer.ggml.tokens", tokens),
        ("tokenizer.ggml.token_type", types),
    ] {
        let Some(MetadataValue::Array(items)) = metadata.get_mut(key) else {
            unreachable!("tiny_metadata writes {key}")
        };
        items.extend(added);
    }
    metadata.insert("tokenizer.ggml.eos_token_id", MetadataValue::Int(267));
    metadata
}

/// GGUF tokenizer metadata of a SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`):
/// `<unk>` (0, unknown), `<s>` (1, control), `</s>` (2, control), the 256 byte tokens
/// `<0x00>`..`<0xFF>` (ids 3..259) when `byte_tokens`, then the pieces `▁`, `h`, `i`, `▁h`,
/// `▁hi`; each id's score is minus the id, so earlier pieces merge first.
pub fn tiny_spm_metadata(byte_tokens: bool) -> MetadataMap {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![2i32, 3, 3];
    if byte_tokens {
        tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        types.resize(tokens.len(), 6);
    }
    for piece in ["\u{2581}", "h", "i", "\u{2581}h", "\u{2581}hi"] {
        tokens.push(piece.to_string());
        types.push(1);
    }
    let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
    let mut metadata = MetadataMap::new();
    metadata.insert(
        "tokenizer.ggml.model",
        MetadataValue::String("llama".into()),
    );
    metadata.insert("tokenizer.ggml.tokens", MetadataValue::strings(tokens));
    metadata.insert("tokenizer.ggml.scores", MetadataValue::floats(scores));
    metadata.insert("tokenizer.ggml.token_type", MetadataValue::ints(types));
    metadata
}

/// The character GPT-2's byte-level alphabet spells `byte` with (`Ġ` for a space).
pub fn byte_char(byte: u8) -> char {
    ByteLevelAlphabet::new().char_of(byte)
}

/// `models/<name>` at the workspace root, or `None` after printing that the test skipped and
/// which script fetches the file: optional models are too large to require everywhere, and the
/// line in the test output keeps a skipped test from passing for a run one. Under `CI=true`
/// ([`in_ci`]), where `scripts/test.sh` fetches every model, a missing one fails the test,
/// naming the file and the script.
pub fn optional_input(name: &str, fetch_script: &str) -> Option<std::path::PathBuf> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    if path.is_file() {
        return Some(path);
    }
    let missing = format!("models/{name} missing, run {fetch_script}");
    assert!(
        !in_ci(),
        "CI is set and an input of this test is missing: {missing}"
    );
    eprintln!("skipped: {missing}");
    None
}

/// Whether `CI` is set (to anything but empty, `0`, `false` or `no`): then a test whose input
/// is missing fails rather than skips.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no"
        )
    })
}
