//! Building a tokenizer from GGUF metadata: every supported pre-tokenizer, Llama 3's whole-word
//! lookup, and malformed or unsupported metadata reported by name rather than a panic.

use std::path::Path;

use sluice_tokenizer::testing::tiny_metadata as tiny_content;
use sluice_tokenizer::{MetadataMap, MetadataValue as Value, Tokenizer, SUPPORTED_PRE_TOKENIZERS};

fn build_err(content: &MetadataMap) -> String {
    match Tokenizer::from_gguf(content, Path::new("x.gguf")) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_supported_pre_tokenizer_builds() {
    for name in SUPPORTED_PRE_TOKENIZERS {
        let tok = Tokenizer::from_gguf(&tiny_content(name), Path::new("x.gguf"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tok.encode(" the 12").unwrap().len(), 4, "{name}");
    }
}

#[test]
fn llama3_takes_whole_words_from_the_vocabulary() {
    // "xyz" is a token no merge produces: Llama 3 still finds it, GPT-2 spells it out.
    let mut content = tiny_content("llama3");
    if let Some(Value::Array(tokens)) = content.get_mut("tokenizer.ggml.tokens") {
        tokens.push(Value::String("xyz".into()));
    }
    if let Some(Value::Array(types)) = content.get_mut("tokenizer.ggml.token_type") {
        types.push(Value::Int(1));
    }
    let llama3 = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
    assert_eq!(llama3.encode("xyz").unwrap(), vec![262]);
    content.insert("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    let gpt2 = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
    assert_eq!(gpt2.encode("xyz").unwrap().len(), 3);
    // Llama 3 vocabularies want BOS unless the file says otherwise.
    assert!(llama3.add_bos_token() && !gpt2.add_bos_token());
}

#[test]
fn unsupported_model_and_pre_tokenizer_are_named() {
    let mut content = tiny_content("gpt-2");
    content.insert("tokenizer.ggml.model", Value::String("t5".into()));
    let err = build_err(&content);
    assert!(
        err.contains("x.gguf")
            && err.contains("`t5`")
            && err.contains("tokenizer.ggml.model")
            && err.contains("`gpt2`")
            && err.contains("`llama`"),
        "{err}"
    );

    let err = build_err(&tiny_content("bogus-pre"));
    assert!(
        err.contains("`bogus-pre`") && err.contains("smollm"),
        "{err}"
    );
}

#[test]
fn malformed_metadata_is_an_error_not_a_panic() {
    let mut content = tiny_content("gpt-2");
    content.remove("tokenizer.ggml.tokens");
    assert!(build_err(&content).contains("tokenizer.ggml.tokens"));

    let mut content = tiny_content("gpt-2");
    content.insert(
        "tokenizer.ggml.merges",
        Value::Array(vec![Value::String("nospace".into())]),
    );
    assert!(build_err(&content).contains("nospace"));

    let mut content = tiny_content("gpt-2");
    content.insert(
        "tokenizer.ggml.merges",
        Value::Array(vec![Value::String("Ġ zz".into())]),
    );
    let err = build_err(&content);
    assert!(err.contains("`zz` is not in the vocabulary"), "{err}");

    let mut content = tiny_content("gpt-2");
    content.insert(
        "tokenizer.ggml.token_type",
        Value::Array(vec![Value::Int(1)]),
    );
    assert!(build_err(&content).contains("tokenizer.ggml.token_type"));

    let mut content = tiny_content("gpt-2");
    content.insert("tokenizer.ggml.tokens", Value::Array(vec![Value::Int(1)]));
    assert!(build_err(&content).contains("not a string"));
}

#[test]
fn out_of_range_special_ids_are_ignored() {
    let mut content = tiny_content("gpt-2");
    content.insert("tokenizer.ggml.bos_token_id", Value::Int(99_999));
    content.insert("tokenizer.ggml.eos_token_id", Value::Int(-1));
    let tok = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
    assert_eq!(tok.bos_token_id(), None);
    assert_eq!(tok.eos_token_id(), None);
    // The end-of-turn tokens are still found by name.
    assert_eq!(tok.eos_token_ids(), &[2, 0]);
}

/// An embedding input ends with EOS when the file asks for it (Qwen3-Embedding's GGUF does, and
/// its last-token pooling reads that EOS), and not otherwise; a prompt never gets one.
#[test]
fn add_eos_token_frames_whole_inputs() {
    let mut content = tiny_content("gpt-2");
    let plain = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
    assert!(!plain.add_eos_token());
    assert_eq!(
        plain.encode_input("the").unwrap(),
        plain.encode_prompt("the").unwrap()
    );

    content.insert("tokenizer.ggml.add_eos_token", Value::Bool(true));
    let tok = Tokenizer::from_gguf(&content, Path::new("x")).unwrap();
    let eos = tok.eos_token_id().unwrap();
    let prompt = tok.encode_prompt("the").unwrap();
    assert_ne!(prompt.last(), Some(&eos), "a prompt gets no EOS");
    let mut framed = prompt.clone();
    framed.push(eos);
    assert_eq!(tok.encode_input("the").unwrap(), framed);
    // Already ending with EOS (written as text): not doubled.
    let text = format!("the{}", tok.decode(&[eos], false));
    assert_eq!(tok.encode_input(&text).unwrap(), framed);
}
