//! The tokenizer, detokenizer and chat template against SmolLM2's own GGUF metadata and the
//! llama.cpp reference fixtures; plus small GGUF files written here to check loading and errors.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sluice_model::GgufFile;
use sluice_tokenizer::{ChatMessage, ChatTemplate, IncrementalDecoder, Tokenizer, TokenizerError};

use common::{ids, model_path, read_jsonl};

fn read_gguf(path: &Path) -> GgufFile {
    GgufFile::open(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// SmolLM2's tokenizer, built once for all tests of this binary.
fn smollm2() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = model_path();
        read_gguf(&path)
            .tokenizer()
            .unwrap_or_else(|e| panic!("cannot build SmolLM2's tokenizer: {e}"))
    })
}

fn chat_template() -> ChatTemplate {
    let tok = smollm2();
    let source = tok.chat_template().expect("SmolLM2 ships a chat template");
    ChatTemplate::new(source, tok.bos_token(), tok.eos_token()).expect("template compiles")
}

fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut dec = IncrementalDecoder::new(skip_special);
    let mut text = String::new();
    for &id in ids {
        text.push_str(dec.push(tok, id));
    }
    text.push_str(&dec.finish());
    text
}

#[test]
fn smollm2_metadata_is_read() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_id(), Some(2));
    assert_eq!(tok.pad_token_id(), Some(2));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    // The file says add_bos_token = false: prompts get no BOS.
    assert!(!tok.add_bos_token());
    // <|im_end|> (the EOS) ends chat turns; <|endoftext|> ends documents.
    assert_eq!(tok.eos_token_ids(), &[2, 0]);
    // The 17 control tokens are special, the rest are not.
    assert!((0..17).all(|id| tok.is_special(id)));
    assert!((17..49152).all(|id| !tok.is_special(id)));
    assert_eq!(tok.id_to_token(216), Some("Ġ"));
    assert_eq!(tok.token_bytes(216), b" ");
    assert_eq!(tok.token_bytes(1), b"<|im_start|>");
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    assert!(tok
        .chat_template()
        .is_some_and(|t| t.contains("<|im_start|>")));
}

#[test]
fn tokenize_fixture_encodes_and_decodes_exactly() {
    let tok = smollm2();
    for row in read_jsonl("smollm2-tokenize.jsonl") {
        let text = row["text"].as_str().expect("text");
        let expected = ids(&row["ids"]);
        let got = tok.encode(text).expect("encode");
        assert_eq!(got, expected, "encoding {text:?}");
        assert_eq!(tok.decode(&got, false), text, "decoding {got:?}");
        assert_eq!(stream(tok, &got, false), text, "streaming {got:?}");
    }
}

#[test]
fn greedy_fixture_prompts_encode_without_bos() {
    let tok = smollm2();
    for row in read_jsonl("smollm2-greedy.jsonl") {
        let prompt = row["prompt"].as_str().expect("prompt");
        let expected = ids(&row["prompt_ids"]);
        assert_eq!(tok.encode(prompt).unwrap(), expected, "prompt {prompt:?}");
        // llama.cpp added no BOS either (the file's add_bos_token is false).
        assert_eq!(
            tok.encode_prompt(prompt).unwrap(),
            expected,
            "prompt {prompt:?}"
        );
    }
}

#[test]
fn chat_fixture_renders_and_encodes_exactly() {
    let tok = smollm2();
    let template = chat_template();
    for row in read_jsonl("smollm2-chat-greedy.jsonl") {
        let messages: Vec<ChatMessage> =
            serde_json::from_value(row["messages"].clone()).expect("messages");
        let rendered = template.render(&messages, true).expect("render");
        assert_eq!(rendered, row["prompt"].as_str().unwrap(), "{messages:?}");
        assert_eq!(
            tok.encode_prompt(&rendered).unwrap(),
            ids(&row["prompt_ids"]),
            "{rendered:?}"
        );
    }
}

#[test]
fn generated_ids_decode_to_fixture_text() {
    let tok = smollm2();
    let rows = read_jsonl("smollm2-greedy.jsonl")
        .into_iter()
        .chain(read_jsonl("smollm2-chat-greedy.jsonl"));
    for row in rows {
        let out = ids(&row["ids"]);
        // `text` is the completion without its final EOS; `pieces` is each id's own text.
        let text = row["text"].as_str().expect("text");
        assert_eq!(tok.decode(&out, true), text);
        assert_eq!(stream(tok, &out, true), text);
        assert_eq!(stream(tok, &out, false), tok.decode(&out, false));
        let pieces = row["pieces"].as_array().expect("pieces");
        assert_eq!(pieces.len(), out.len());
        for (&id, piece) in out.iter().zip(pieces) {
            let piece = piece.as_str().expect("piece");
            // A piece holding part of a character was written lossily; compare whole ones.
            if !piece.contains('\u{FFFD}') {
                assert_eq!(tok.token_bytes(id), piece.as_bytes(), "id {id}");
            }
        }
    }
}

#[test]
fn streaming_random_ids_matches_decode() {
    use rand::{Rng, SeedableRng};
    let tok = smollm2();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Byte tokens (ids 17..273 hold the single bytes and many fragments) make partial UTF-8
    // common; sprinkle in arbitrary ids, specials and out-of-range ids.
    for _ in 0..500 {
        let ids: Vec<u32> = (0..rng.gen_range(1..40))
            .map(|_| match rng.gen_range(0..10) {
                0 => rng.gen_range(0..17),
                1 => rng.gen_range(0..60_000),
                2..=4 => rng.gen_range(17..49152),
                _ => rng.gen_range(17..300),
            })
            .collect();
        for skip in [false, true] {
            assert_eq!(stream(tok, &ids, skip), tok.decode(&ids, skip), "{ids:?}");
        }
    }
}

#[test]
fn multibyte_characters_stream_whole() {
    let tok = smollm2();
    let text = "emoji 🦀👍🏽 done 中文字符测试";
    let ids = tok.encode(text).unwrap();
    let mut dec = IncrementalDecoder::new(true);
    let mut pieces = Vec::new();
    for &id in &ids {
        let piece = dec.push(tok, id).to_string();
        assert!(!piece.contains('\u{FFFD}'), "half a character in {piece:?}");
        pieces.push(piece);
    }
    assert_eq!(dec.finish(), "");
    assert_eq!(pieces.concat(), text);
    // Some ids carried only part of a character, so some pushes returned nothing.
    assert!(pieces.iter().any(String::is_empty));
}

/// SmolLM2's tokenizer as its Hugging Face tokenizer.json declares it, built with the
/// `tokenizers` crate from the GGUF vocabulary: an independent implementation (Oniguruma
/// regexes, its own BPE) that ours must agree with on any text.
fn hf_oracle() -> &'static tokenizers::Tokenizer {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::pre_tokenizers::{byte_level::ByteLevel, digits::Digits, sequence::Sequence};
    static ORACLE: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let file = read_gguf(&model_path());
        let strings = |key: &str| -> Vec<String> {
            match &file.metadata()[key] {
                Value::Array(items) => items
                    .iter()
                    .map(|v| v.to_string().expect("string").clone())
                    .collect(),
                other => panic!("{key}: {other:?}"),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens");
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")
            .iter()
            .map(|m| {
                let (a, b) = m.split_once(' ').expect("merge");
                (a.to_string(), b.to_string())
            })
            .collect();
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .unwrap();
        let mut tk = tokenizers::Tokenizer::new(bpe);
        tk.with_pre_tokenizer(Some(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])));
        let tok = smollm2();
        let specials: Vec<tokenizers::AddedToken> = (0..tok.vocab_size() as u32)
            .filter(|&id| tok.is_special(id))
            .map(|id| tokenizers::AddedToken::from(tokens[id as usize].clone(), true))
            .collect();
        tk.add_special_tokens(&specials);
        tk
    })
}

fn oracle_encode(text: &str) -> Vec<u32> {
    hf_oracle()
        .encode(text, false)
        .expect("oracle encode")
        .get_ids()
        .to_vec()
}

#[test]
fn encoding_matches_the_tokenizers_crate_on_random_text() {
    use rand::{Rng, SeedableRng};
    let tok = smollm2();
    let words = [
        "the",
        " the",
        "The",
        " quick",
        "brown",
        " fox",
        "don't",
        "I'll",
        " we've",
        "'S",
        "12",
        "3.14",
        "1,000",
        " 2024-01-01",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im",
        "<repo_name>",
        "\n",
        "\n\n",
        "\r\n",
        "\t",
        "    ",
        "  ",
        " ",
        "def ",
        "fn(",
        ");",
        "{}",
        "==",
        "->",
        "café",
        "naïve",
        "中文",
        "日本語",
        "Привет",
        "مرحبا",
        "🦀",
        "👍🏽",
        "\u{a0}",
        "\u{2009}",
        "\u{3000}",
        "٣٤",
        "²",
        "e\u{301}",
        "ſ",
        "…",
        "--",
        "**",
        "https://x.y/z?q=1",
        "aaaaaaaa",
        "ⅫⅫ",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut checked = 0;
    for _ in 0..3000 {
        let n = rng.gen_range(0..30);
        let mut text = String::new();
        for _ in 0..n {
            if rng.gen_bool(0.8) {
                text.push_str(words[rng.gen_range(0..words.len())]);
            } else {
                // Any scalar value below U+3000 or an emoji: unassigned and rare ones too.
                let c = match rng.gen_range(0..4) {
                    0 => rng.gen_range(0x1F300..0x1FAFF),
                    _ => rng.gen_range(0..0x3000),
                };
                // Bytes without a token are dropped by llama.cpp's rule, which the oracle does
                // not follow (see `bytes_missing_from_the_vocabulary_are_dropped`).
                if !MISSING_BYTES.contains(&c) {
                    text.extend(char::from_u32(c));
                }
            }
        }
        assert_eq!(tok.encode(&text).unwrap(), oracle_encode(&text), "{text:?}");
        checked += 1;
    }
    // Long words take the heap path of the merge loop: a run of one letter, a base64-like
    // blob, a long run of spaces and of digits.
    let blob: String = (0..5000)
        .map(|_| char::from(b"AbCdEfGhIjKlMnOpQrStUvWxYz0123456789+/"[rng.gen_range(0..38)]))
        .collect();
    for text in [
        "a".repeat(5000),
        blob,
        " ".repeat(3000) + "x",
        "9".repeat(2000),
        "é".repeat(1000),
    ] {
        assert_eq!(tok.encode(&text).unwrap(), oracle_encode(&text));
        checked += 1;
    }
    assert_eq!(checked, 3005);
}

/// Bytes SmolLM2's vocabulary has no token for, below 0x80 (the others only occur in
/// characters beyond U+3FFFF).
const MISSING_BYTES: [u32; 6] = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D];

#[test]
fn bytes_missing_from_the_vocabulary_are_dropped() {
    let tok = smollm2();
    // As llama.cpp does: 0x14 has no token, so it is left out, and no merge spans it ("->"
    // stays one token and "'" another, where the `tokenizers` crate would merge ">'").
    let ids = tok.encode("->\u{14}'S").unwrap();
    assert_eq!(ids, vec![22690, 23, 67]);
    assert_eq!(tok.decode(&ids, false), "->'S");
    assert_eq!(tok.encode("\u{14}").unwrap(), Vec::<u32>::new());
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes are themselves, the other 68 bytes
/// are moved to U+0100 onwards in byte order.
fn gpt2_byte_chars() -> Vec<char> {
    let mut shifted = 256u32;
    (0..=255u8)
        .map(|b| {
            if matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF) {
                char::from(b)
            } else {
                shifted += 1;
                char::from_u32(shifted - 1).unwrap()
            }
        })
        .collect()
}

/// Writes a GGUF file with a small byte-level vocabulary, one dummy tensor and the given
/// tokenizer model and pre-tokenizer names.
fn write_tiny_gguf(dir: &Path, name: &str, model: &str, pre: &str) -> PathBuf {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into()];
    let mut types = vec![3i32, 3];
    for c in gpt2_byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w"];
    for merge in merges {
        tokens.push(merge.replace(' ', ""));
        types.push(1);
    }
    tokens.push("<tool>".into());
    types.push(4);
    let strings = |v: &[String]| Value::Array(v.iter().cloned().map(Value::String).collect());
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("tokenizer.ggml.model", Value::String(model.into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.merges", strings(&merges.map(String::from))),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(0)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
        (
            "tokenizer.chat_template",
            Value::String(
                "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}".into(),
            ),
        ),
    ];
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let weight = Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
    let weight = QTensor::quantize(&weight, GgmlDType::F32).unwrap();
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut file, &metadata, &[("token_embd.weight", &weight)]).unwrap();
    path
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-tokenizer-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn tiny_gguf_file_loads_and_tokenizes() {
    let dir = scratch_dir("tiny");
    let path = write_tiny_gguf(&dir, "tiny.gguf", "gpt2", "smollm");
    let tok = read_gguf(&path).tokenizer().unwrap();
    assert_eq!(tok.vocab_size(), 2 + 256 + 5 + 1);
    let hello = tok.token_to_id("hello").unwrap();
    let space_w = tok.token_to_id("Ġw").unwrap();
    let tool = tok.token_to_id("<tool>").unwrap();
    let o = tok.token_to_id("o").unwrap();
    assert_eq!(
        tok.encode("hello<tool> wo").unwrap(),
        vec![hello, tool, space_w, o]
    );
    // add_bos_token = true in this file.
    assert_eq!(tok.encode_prompt("hello").unwrap(), vec![1, hello]);
    // <tool> is user-defined: content, so kept when special tokens are skipped.
    assert_eq!(tok.decode(&[1, hello, tool], true), "hello<tool>");
    assert_eq!(tok.eos_token_ids(), &[0]);
    let template = ChatTemplate::new(
        tok.chat_template().unwrap(),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    let rendered = template
        .render(&[ChatMessage::new("user", "hello")], true)
        .unwrap();
    assert_eq!(rendered, "<|im_start|>hello");
    assert_eq!(tok.encode_prompt(&rendered).unwrap(), vec![1, hello]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unsupported_tokenizers_are_clear_errors() {
    let dir = scratch_dir("unsupported");
    let wordpiece = write_tiny_gguf(&dir, "wp.gguf", "bert", "default");
    let err = read_gguf(&wordpiece).tokenizer().unwrap_err();
    assert!(
        matches!(
            err,
            sluice_model::ModelError::Tokenizer(TokenizerError::Unsupported { .. })
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("wp.gguf") && msg.contains("`bert`") && msg.contains("gpt2"),
        "{msg}"
    );
    // A SentencePiece vocabulary (`llama`) is read, and one without its scores is refused
    // naming the key.
    let sentencepiece = write_tiny_gguf(&dir, "spm.gguf", "llama", "default");
    let msg = read_gguf(&sentencepiece)
        .tokenizer()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("spm.gguf") && msg.contains("tokenizer.ggml.scores"),
        "{msg}"
    );

    let odd_pre = write_tiny_gguf(&dir, "pre.gguf", "gpt2", "mystery-pre");
    let msg = read_gguf(&odd_pre).tokenizer().unwrap_err().to_string();
    assert!(
        msg.contains("pre.gguf") && msg.contains("`mystery-pre`") && msg.contains("qwen2"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tokenizer_json_loads_with_its_config() {
    // A minimal byte-level tokenizer.json in the Hugging Face format, with a config beside it.
    let dir = scratch_dir("hf");
    let chars = gpt2_byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), (i as u32).into());
    }
    vocab.insert("he".into(), 256.into());
    vocab.insert("<|im_end|>".into(), 257.into());
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": 257, "content": "<|im_end|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
            "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "vocab": vocab,
            "merges": ["h e"]}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>", "bos_token": null, "chat_template": "{{ messages[0].content }}"}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_file(&path).unwrap();
    assert_eq!(tok.vocab_size(), 258);
    assert_eq!(tok.encode("he<|im_end|>").unwrap(), vec![256, 257]);
    assert_eq!(tok.decode(&[256, 257], true), "he");
    assert_eq!(tok.eos_token_id(), Some(257));
    assert_eq!(tok.eos_token_ids(), &[257]);
    assert_eq!(tok.bos_token_id(), None);
    assert!(!tok.add_bos_token());
    assert_eq!(tok.chat_template(), Some("{{ messages[0].content }}"));

    std::fs::write(&path, "{ not json").unwrap();
    let err = Tokenizer::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
