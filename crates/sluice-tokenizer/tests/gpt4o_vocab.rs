//! The GPT-4o (o200k) pre-tokenizer of byte-level BPE GGUF vocabularies
//! (`tokenizer.ggml.pre = "gpt-4o"`) against llama.cpp: `ggml-vocab-gpt-4o.gguf` (GPT-2's
//! vocabulary relabelled `gpt-4o`) and the ids llama.cpp 0.3.36's `llama-tokenize` gave for
//! tricky strings (`gpt-4o-tokenize.jsonl`, `tests/fixtures/tokenizer/README.md` says how).
//! Every id must be identical, and decoding must give each text back.

mod common;

use common::{fixture, read_gguf_metadata};
use sluice_tokenizer::{IncrementalDecoder, MetadataValue, Tokenizer};

fn gpt4o() -> Tokenizer {
    let path = fixture("ggml-vocab-gpt-4o.gguf");
    Tokenizer::from_gguf(&read_gguf_metadata(&path), &path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `{"text", "ids"}` rows of `gpt-4o-tokenize.jsonl`.
fn cases() -> Vec<(String, Vec<u32>)> {
    let path = fixture("gpt-4o-tokenize.jsonl");
    let raw = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    raw.lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let text = row["text"].as_str().unwrap().to_string();
            let ids = row["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|id| id.as_u64().unwrap() as u32)
                .collect();
            (text, ids)
        })
        .collect()
}

#[test]
fn gpt4o_matches_llama_cpp() {
    let tok = gpt4o();
    let cases = cases();
    assert_eq!(cases.len(), 82);
    let mut failures = Vec::new();
    for (text, expected) in &cases {
        let got = tok.encode(text).unwrap();
        if &got != expected {
            failures.push(format!(
                "{text:?}:\n  llama.cpp {expected:?}\n  sluice    {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // A GPT-4o vocabulary wants no BOS unless the file says so, as in llama.cpp.
    assert!(!tok.add_bos_token());
}

#[test]
fn gpt4o_decode_gives_the_text_back() {
    let tok = gpt4o();
    for (text, ids) in cases() {
        assert_eq!(tok.decode(&ids, false), text, "{ids:?}");
        let mut dec = IncrementalDecoder::new(false);
        let mut streamed: String = ids
            .iter()
            .map(|&id| dec.push(&tok, id).to_string())
            .collect();
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, text, "{ids:?}");
    }
}

/// The ids see the split through GPT-2's merges, which hide most differences: the fixture
/// still tells GPT-4o's split from the others (case changes cut `iPhone`, digits come in
/// threes), so a wrong mapping of `gpt-4o` fails the test above.
#[test]
fn gpt4o_ids_tell_the_split_from_others() {
    let path = fixture("ggml-vocab-gpt-4o.gguf");
    for pre in ["gpt-2", "llama-bpe", "qwen2"] {
        let mut metadata = read_gguf_metadata(&path);
        metadata.insert("tokenizer.ggml.pre", MetadataValue::String(pre.into()));
        let tok = Tokenizer::from_gguf(&metadata, &path).unwrap();
        let differ = cases()
            .iter()
            .filter(|(text, ids)| &tok.encode(text).unwrap() != ids)
            .count();
        assert!(differ >= 3, "{pre}: only {differ} cases differ");
    }
}
