//! Qwen2.5-Coder-1.5B-Instruct (qwen2, Q4_K_M), the optional larger model: 128-wide heads, six
//! query heads per KV head, a 9k-wide MLP, and 1.1 GB of K-quants, where an f32 copy (7 GB) is
//! what memory has to be watched for. `scripts/fetch-qwen-1.5b.sh` fetches it (CI does,
//! through `scripts/test.sh`); without it each test prints why it skipped and passes.

mod common;

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use common::decode::{assert_batching_changes_no_token, greedy_alone};
use common::python::assert_fibonacci_body;
use sluice_model::testing::optional_model;
use sluice_model::{Architecture, LlamaModel, LoadOptions, ModelSource, WeightsKind};
use sluice_tokenizer::Tokenizer;

const GGUF: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const FETCH: &str = "scripts/fetch-qwen-1.5b.sh";

fn tokenizer() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    let path = optional_model(GGUF, FETCH)?;
    Some(TOKENIZER.get_or_init(|| ModelSource::open(&path).unwrap().tokenizer().unwrap()))
}

/// The one model this binary holds, and the kind it was loaded as. Not a `OnceLock` per kind:
/// where `auto` keeps no quantized panels for K-quants it is an f32 copy too, and two 7 GB
/// copies at once is more than a CI machine should need. Tests take turns on the lock (which
/// also keeps two forwards of this size off the same cores); one that needs the other kind
/// drops the model before loading it.
static MODEL: Mutex<Option<(WeightsKind, LlamaModel)>> = Mutex::new(None);

/// The kind the model is held as now, if any.
fn resident() -> Option<WeightsKind> {
    MODEL
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|(k, _)| *k)
}

/// Runs `f` on the model as `kind` holds it, loading it first unless it is already held so.
fn with_model<R>(kind: WeightsKind, f: impl FnOnce(&LlamaModel) -> R) -> Option<R> {
    let path = optional_model(GGUF, FETCH)?;
    // A test that failed while holding the lock leaves a usable model behind.
    let mut slot = MODEL.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().map(|(k, _)| *k) != Some(kind) {
        // Dropped before the next load, so the two are never in memory together.
        *slot = None;
        let started = Instant::now();
        let options = LoadOptions {
            weights: kind,
            ..LoadOptions::default()
        };
        let model = LlamaModel::load(&path, &options).unwrap();
        eprintln!("{kind} weights loaded in {:.1?}", started.elapsed());
        *slot = Some((kind, model));
    }
    Some(f(&slot.as_ref().unwrap().1))
}

#[test]
fn hyper_parameters_and_tokenizer() {
    let Some(path) = optional_model(GGUF, FETCH) else {
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
            config.head_dim,
            config.intermediate_size,
            config.vocab_size,
        ),
        (1536, 28, 12, 2, 128, 8960, 151936)
    );
    // Unlike Qwen's safetensors, this file carries its own output.weight (Q6_K).
    assert!(!config.tie_word_embeddings);
    assert_eq!(config.rope_theta, 1_000_000.0);

    let tok = source.tokenizer().unwrap();
    assert_eq!(tok.vocab_size(), 151936);
    assert!(!tok.add_bos_token());
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!(im_end, 151645);
    assert!(tok.eos_token_ids().contains(&im_end));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    // Qwen2.5-Coder shares one vocabulary across sizes: every prompt llama.cpp tokenized for
    // the 0.5B fixtures (chat rows with their special tokens) must give the same ids here.
    let mut rows = common::read_jsonl("qwen2.5-coder-0.5b-greedy.jsonl");
    rows.extend(common::read_jsonl("qwen2.5-coder-0.5b-chat-greedy.jsonl"));
    for row in &rows {
        let text = row["prompt"].as_str().unwrap();
        let ids = tok.encode_prompt(text).unwrap();
        assert_eq!(ids, common::ids(&row["prompt_ids"]), "{text:?}");
        assert_eq!(tok.decode(&ids, false), text);
    }
}

/// `auto` (as served) computes the K-quants in llama.cpp's integer arithmetic, the same as
/// `quantized`: the prompt's logits are bit for bit the same both ways (every matrix of this
/// file is Q4_K or Q6_K).
#[test]
fn auto_computes_the_k_quants_as_quantized_does() {
    let Some(tok) = tokenizer() else {
        return;
    };
    let ids = tok
        .encode_prompt("def is_prime(n: int) -> bool:\n")
        .unwrap();
    // Whichever kind is held already goes first, so the binary loads each kind once whenever
    // another test is not between the two.
    let order = match resident() {
        Some(WeightsKind::Quantized) => [WeightsKind::Quantized, WeightsKind::Auto],
        _ => [WeightsKind::Auto, WeightsKind::Quantized],
    };
    let logits: Vec<Vec<u32>> = order
        .iter()
        .map(|&kind| {
            with_model(kind, |m| {
                let blocks = ids.len().div_ceil(common::decode::BLOCK);
                let mut kv = m.new_kv_cache(blocks, common::decode::BLOCK).unwrap();
                let mut batch = sluice_model::StepBatch::new(common::decode::BLOCK);
                let table: Vec<u32> = (0..blocks as u32).collect();
                batch.push_sequence(&ids, 0, &table, true);
                let row = m
                    .forward(&batch, &mut kv)
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap();
                row[0].iter().map(|x| x.to_bits()).collect()
            })
            .unwrap()
        })
        .collect();
    assert!(logits[0] == logits[1], "auto and quantized logits differ");
}

/// Eight sequences decoded together (joining over four steps, so prefills share steps with
/// decodes) give exactly the greedy tokens each gives alone, as served (`auto`).
#[test]
fn batching_changes_no_token() {
    let Some(tok) = tokenizer() else {
        return;
    };
    let prompts: Vec<Vec<u32>> = [
        "def is_prime(n: int) -> bool:\n",
        "The capital of France is",
        "// Binary search in Rust\nfn binary_search(xs: &[i32], x: i32) -> Option<usize> {\n",
        "SELECT name, COUNT(*) FROM",
        "import numpy as np\n\ndef softmax(x):\n",
        "Once upon a time",
        "#include <stdio.h>\n\nint main(void) {\n",
        "x",
    ]
    .iter()
    .map(|p| tok.encode(p).unwrap())
    .collect();
    let (eos, max_new) = (tok.eos_token_ids(), 8);
    let alone = with_model(WeightsKind::Auto, |m| {
        assert_batching_changes_no_token(m, &prompts, max_new, eos, |t| tok.decode(t, false)).0
    })
    .unwrap();
    assert!(alone.iter().filter(|a| a.len() == max_new).count() >= 4);
}

/// A coherent greedy continuation: a Python body that returns, recursing or using `n`.
#[test]
fn fibonacci_continues_with_python() {
    let Some(tok) = tokenizer() else {
        return;
    };
    let prompt = "def fibonacci(n):";
    let ids = tok.encode_prompt(prompt).unwrap();
    let started = Instant::now();
    let out = with_model(WeightsKind::Auto, |m| {
        greedy_alone(m, &ids, 48, tok.eos_token_ids())
    })
    .unwrap();
    let text = format!("{prompt}{}", tok.decode(&out, true));
    eprintln!(
        "{text}\n({} tokens in {:.1?})",
        out.len(),
        started.elapsed()
    );
    assert_fibonacci_body(&text);
}
