//! Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4_K_M GGUF), the optional second real model, and its
//! Hugging Face tokenizer.json. `scripts/fetch-qwen.sh` fetches both (CI does, through
//! `scripts/test.sh`); when they are absent each test prints why it skipped and passes.

use std::path::PathBuf;
use std::sync::OnceLock;

mod common;

use common::python::assert_fibonacci_body;
use sluice_model::{Architecture, LlamaModel, LoadOptions, ModelSource, StepBatch, WeightsKind};
use sluice_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

const GGUF: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const TOKENIZER_JSON: &str = "qwen2.5-coder-0.5b-instruct.tokenizer.json";
const BLOCK: usize = 16;

/// `models/<name>`, or `None` after saying the test skipped (a failure under `CI=true`).
fn optional_file(name: &str) -> Option<PathBuf> {
    sluice_model::testing::optional_model(name, "scripts/fetch-qwen.sh")
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
    assert_fibonacci_body(&text);
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

/// The tokenizer alone, from the GGUF's metadata (no weights read).
fn qwen_tokenizer() -> Option<Tokenizer> {
    let path = optional_file(GGUF)?;
    Some(
        sluice_model::GgufFile::open(&path)
            .unwrap()
            .tokenizer()
            .unwrap(),
    )
}

// Qwen2.5's tool-call tags are ordinary text to the tokenizer: `<tool_call>` (151657) and
// `</tool_call>` (151658) are user-defined added tokens, not control tokens, so decoding with
// `skip_special_tokens` keeps them and the tool parser sees them; `<|im_end|>` stays special.

#[test]
fn qwen_tool_call_tags_are_text_and_im_end_is_special() {
    let Some(tokenizer) = qwen_tokenizer() else {
        return;
    };
    let opening = tokenizer.token_to_id("<tool_call>").unwrap();
    let closing = tokenizer.token_to_id("</tool_call>").unwrap();
    assert_eq!((opening, closing), (151657, 151658));
    assert!(!tokenizer.is_special(opening) && !tokenizer.is_special(closing));
    assert_eq!(tokenizer.decode(&[opening], true), "<tool_call>");
    assert_eq!(tokenizer.decode(&[closing], true), "</tool_call>");
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    assert!(tokenizer.is_special(im_end));
    assert_eq!(tokenizer.decode(&[im_end], true), "");
    // The tag in text encodes to its single id, so the prompt shows the model its own token.
    assert_eq!(tokenizer.encode("<tool_call>").unwrap(), vec![opening]);

    // Qwen's own template renders tools itself, in the Hermes format the parser reads.
    let template = ChatTemplate::new(tokenizer.chat_template().unwrap(), None, None).unwrap();
    assert!(template.renders_tools());
    assert_eq!(
        template.tool_call_format(),
        sluice_tokenizer::ToolCallFormat::Hermes
    );
}

#[test]
fn qwen_template_renders_tools_and_history_as_hugging_face_does() {
    let Some(tokenizer) = qwen_tokenizer() else {
        return;
    };
    let template = ChatTemplate::new(tokenizer.chat_template().unwrap(), None, None).unwrap();
    // Key order, `<>&'`, non-ASCII and a float default must come out as json.dumps writes them.
    let tool_text = r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'later' in °C", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1.0}}, "required": ["city"]}}}"#;
    let tools = [serde_json::from_str::<serde_json::Value>(tool_text).unwrap()];
    let messages: Vec<sluice_tokenizer::ChatMessage> = serde_json::from_str(
        r#"[{"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
            {"role": "tool", "content": "{\"temp\": 21.5}", "tool_call_id": "call_1"}]"#,
    )
    .unwrap();
    let options = sluice_tokenizer::RenderOptions {
        add_generation_prompt: true,
        tools: Some(&tools),
        kwargs: None,
    };
    let prompt = template.render_with(&messages, &options).unwrap();
    // For a byte-for-byte comparison with Python's jinja2 rendering the same template by hand.
    if let Ok(out) = std::env::var("SLUICE_DUMP_QWEN_PROMPT") {
        std::fs::write(out, &prompt).unwrap();
    }
    assert!(
        prompt.contains(&format!("<tools>\n{tool_text}\n</tools>")),
        "{prompt}"
    );
    assert!(prompt.contains(
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n</tool_call><|im_end|>\n"
    ), "{prompt}");
    assert!(prompt.ends_with(
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21.5}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ), "{prompt}");
}
