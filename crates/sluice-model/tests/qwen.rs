//! Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4_K_M GGUF), the optional second real model, and its
//! Hugging Face tokenizer.json. `scripts/fetch-qwen.sh` fetches both (CI does, through
//! `scripts/test.sh`); when they are absent each test prints why it skipped and passes.

use std::path::PathBuf;
use std::sync::OnceLock;

mod common;

use common::python::python_parses;
use sluice_model::{Architecture, LlamaModel, LoadOptions, ModelSource, StepBatch, WeightsKind};
use sluice_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

const GGUF: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const TOKENIZER_JSON: &str = "qwen2.5-coder-0.5b-instruct.tokenizer.json";
const BLOCK: usize = 16;

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// `models/<name>`, or `None` after saying the test skipped.
fn optional_file(name: &str) -> Option<PathBuf> {
    let path = models_dir().join(name);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: models/{name} missing, run scripts/fetch-qwen.sh");
        None
    }
}

/// The model with the server's defaults (`auto` weights: Q4_K/Q6_K have no quantized panels,
/// so every layer runs on f32 panels), loaded once for all tests of this binary.
fn qwen() -> Option<&'static (LlamaModel, Tokenizer)> {
    let path = optional_file(GGUF)?;
    static MODEL: OnceLock<(LlamaModel, Tokenizer)> = OnceLock::new();
    Some(MODEL.get_or_init(|| {
        let mut source = ModelSource::open(&path).unwrap();
        let tokenizer = source.tokenizer().unwrap();
        let model = source.load_model(&LoadOptions::default()).unwrap();
        (model, tokenizer)
    }))
}

/// Greedy continuation of `prompt`, up to `max` tokens or an end-of-generation id (not kept).
fn greedy(model: &LlamaModel, tok: &Tokenizer, prompt: &[u32], max: usize) -> (Vec<u32>, bool) {
    let blocks = (prompt.len() + max).div_ceil(BLOCK);
    let mut kv = model.new_kv_cache(blocks, BLOCK).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = StepBatch::new(BLOCK);
    batch.push_sequence(prompt, 0, &table, true);
    let mut out = Vec::new();
    for step in 0..max {
        let logits = model
            .forward(&batch, &mut kv)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        if tok.eos_token_ids().contains(&next) {
            return (out, true);
        }
        out.push(next);
        batch.clear();
        batch.push_sequence(&[next], prompt.len() + step, &table, true);
    }
    (out, false)
}

#[test]
fn qwen_gguf_hyper_parameters_and_tokenizer() {
    let Some(path) = optional_file(GGUF) else {
        return;
    };
    let mut source = ModelSource::open(&path).unwrap();
    let config = source.model_config().unwrap();
    assert_eq!(config.architecture, Architecture::Qwen2);
    assert_eq!(
        (
            config.hidden_size,
            config.num_layers,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim
        ),
        (896, 24, 14, 2, 64)
    );
    // This file carries its own output.weight.
    assert!(!config.tie_word_embeddings);
    let tok = source.tokenizer().unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(tok.eos_token_ids().contains(&im_end));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
}

/// The npm tokenizer.json (Hugging Face's, run by the `tokenizers` crate) and the GGUF
/// vocabulary (our BPE with the qwen2 pre-tokenizer) give the same ids.
#[test]
fn qwen_tokenizer_json_matches_the_gguf_vocabulary() {
    let (Some(gguf), Some(json)) = (optional_file(GGUF), optional_file(TOKENIZER_JSON)) else {
        return;
    };
    let ours = ModelSource::open(&gguf).unwrap().tokenizer().unwrap();
    let hf = Tokenizer::from_file(&json).unwrap();
    let texts = [
        "def fibonacci(n):\n    if n <= 1:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        "Hello, world! It's 2024; we've got 1234567 reasons.",
        "naïve café, 日本語のテキスト, emoji 😀🚀, Ελληνικά",
        "  leading\tand trailing  \n\n\n  spaces   ",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
        "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\r\nprint(x)",
    ];
    for text in texts {
        assert_eq!(
            ours.encode(text).unwrap(),
            hf.encode(text).unwrap(),
            "{text:?}"
        );
    }
    for text in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"] {
        assert_eq!(ours.token_to_id(text), hf.token_to_id(text), "{text}");
    }
}

#[test]
fn fibonacci_continues_with_python() {
    let Some((model, tok)) = qwen() else {
        return;
    };
    let prompt = "def fibonacci(n):";
    let ids = tok.encode_prompt(prompt).unwrap();
    let (out, _) = greedy(model, tok, &ids, 48);
    let text = format!("{prompt}{}", tok.decode(&out, true));
    eprintln!("{text}");
    assert!(text.contains("return"), "{text}");
    assert!(
        text.matches("fibonacci(").count() >= 2 || text.contains(" n"),
        "the body does not use fibonacci or n: {text}"
    );
    match python_parses(&text) {
        Some(ok) => assert!(ok, "not a Python function body:\n{text}"),
        None => eprintln!("python3 not found: the syntax check was skipped"),
    }
}

#[test]
fn chat_answers_with_the_chatml_template() {
    let Some((model, tok)) = qwen() else {
        return;
    };
    let template = ChatTemplate::new(
        tok.chat_template().unwrap(),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    let text = template
        .render(
            &[ChatMessage::new(
                "user",
                "What is 2+3? Answer with just the number.",
            )],
            true,
        )
        .unwrap();
    assert!(text.starts_with("<|im_start|>system\n"), "{text}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    let (out, stopped) = greedy(model, tok, &tok.encode(&text).unwrap(), 32);
    let answer = tok.decode(&out, true);
    eprintln!("{answer:?}");
    assert!(stopped, "no end of turn within 32 tokens: {answer:?}");
    assert!(answer.contains('5'), "{answer:?}");
}

/// `--weights f32` and `auto` give the same greedy code (auto holds only f32 panels here, with
/// AMX for large steps where the CPU has it).
#[test]
fn qwen_f32_weights_agree_with_auto() {
    let Some((auto, tok)) = qwen() else {
        return;
    };
    let path = optional_file(GGUF).unwrap();
    let options = LoadOptions {
        weights: WeightsKind::F32,
        ..LoadOptions::default()
    };
    let f32_model = LlamaModel::load(&path, &options).unwrap();
    let ids = tok.encode("def is_prime(n):").unwrap();
    assert_eq!(
        greedy(&f32_model, tok, &ids, 16).0,
        greedy(auto, tok, &ids, 16).0
    );
}
