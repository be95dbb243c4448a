//! Hugging Face model directories: tiny random qwen2/qwen3 checkpoints written here (sharded,
//! f32 and bf16) must give candle-transformers' own qwen2/qwen3 logits; tiny llama and the real
//! SmolLM2 exported from GGUF must give exactly what the GGUF file gives; bad directories are
//! errors naming the file and the field or tensor.

// candle-transformers' oracle models load their weights through an unsafe memory map.
#![allow(unsafe_code)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use sluice_model::hf::{CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use sluice_model::testing::{write_hf_from_gguf, HfExport, TinyModelSpec};
use sluice_model::{
    Architecture, HfModelDir, LlamaModel, LoadOptions, ModelError, ModelSource, RopeScaling,
    StepBatch, WeightsKind,
};
use sluice_tokenizer::Tokenizer;

use common::{ids, model_path, read_jsonl};

const BLOCK: usize = 16;

fn options(weights: WeightsKind) -> LoadOptions {
    LoadOptions {
        weights,
        kv_dtype: sluice_model::KvDtype::F32,
        ..LoadOptions::default()
    }
}

fn load(path: &Path, weights: WeightsKind) -> LlamaModel {
    LlamaModel::load(path, &options(weights))
        .unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
}

/// Logits `[vocab]` of the last token of `tokens`, one sequence prefilled in one step.
fn last_logits(model: &LlamaModel, tokens: &[u32]) -> Vec<f32> {
    let blocks = tokens.len().div_ceil(BLOCK);
    let mut kv = model.new_kv_cache(blocks, BLOCK).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = StepBatch::new(BLOCK);
    batch.push_sequence(tokens, 0, &table, true);
    model
        .forward(&batch, &mut kv)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// Greedy continuation of `prompt` by `n` tokens: one prefill, then a decode step per token.
fn greedy(model: &LlamaModel, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let total = prompt.len() + n;
    let blocks = total.div_ceil(BLOCK);
    let mut kv = model.new_kv_cache(blocks, BLOCK).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = StepBatch::new(BLOCK);
    batch.push_sequence(prompt, 0, &table, true);
    let (mut out, mut all_logits) = (Vec::new(), Vec::new());
    for step in 0..n {
        let logits = model
            .forward(&batch, &mut kv)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let next = argmax(&logits);
        out.push(next);
        all_logits.push(logits);
        batch.clear();
        batch.push_sequence(&[next], prompt.len() + step, &table, true);
    }
    (out, all_logits)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 {
                (i, x)
            } else {
                best
            }
        })
        .0 as u32
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn tiny_dir(spec: &TinyModelSpec, export: &HfExport) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    spec.write_hf(&dir, export).unwrap();
    (tmp, dir)
}

fn safetensors_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    files
}

const PROMPT: [u32; 10] = [72, 101, 108, 108, 111, 256, 44, 32, 258, 33];

fn qwen2_spec() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Qwen2,
        hidden_size: 96,
        num_heads: 6,
        num_kv_heads: 2,
        ..TinyModelSpec::default()
    }
}

/// qwen3 with a head size of its own: 4 heads of 32 over a hidden size of 64.
fn qwen3_spec() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Qwen3,
        hidden_size: 64,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: Some(32),
        ..TinyModelSpec::default()
    }
}

/// Gemma 3's layers: 4 heads of 32 over a hidden size of 64, a local layer (window 8) then a
/// global one, logits soft-capped at 30 (`TinyModelSpec::write_gguf`'s gemma3 keys).
fn gemma3_spec() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Gemma3,
        head_dim: Some(32),
        ..TinyModelSpec::default()
    }
}

/// SmolLM3's layers: 4, the last without RoPE (config.json's `no_rope_layers`).
fn smollm3_spec() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::SmolLm3,
        num_layers: 4,
        ..TinyModelSpec::default()
    }
}

/// candle-transformers' gemma3 over the directory's safetensors: last-position logits, fed
/// one token at a time (its local layers' rotating cache then holds the window's keys, as
/// transformers and llama.cpp see them; a whole prompt at once fails in its cache's
/// `slice_set` on a transposed tensor, and its prompt mask lets a local layer see one key
/// more).
fn candle_gemma3(dir: &Path, spec: &TinyModelSpec, tokens: &[u32]) -> Vec<f32> {
    use candle_transformers::models::gemma3;
    let cfg = gemma3::Config {
        attention_bias: false,
        head_dim: spec.head_dim(),
        hidden_activation: candle_nn::Activation::GeluPytorchTanh,
        hidden_size: spec.hidden_size,
        intermediate_size: spec.intermediate_size,
        num_attention_heads: spec.num_heads,
        num_hidden_layers: spec.num_layers,
        num_key_value_heads: spec.num_kv_heads,
        rms_norm_eps: 1e-5f32 as f64,
        rope_theta: 1_000_000.0,
        rope_local_base_freq: 10_000.0,
        vocab_size: spec.vocab_size(),
        final_logit_softcapping: Some(30.0),
        attn_logit_softcapping: None,
        query_pre_attn_scalar: spec.head_dim(),
        sliding_window: sluice_model::testing::TINY_GEMMA_WINDOW,
        sliding_window_pattern: 2,
        max_position_embeddings: spec.context_length,
    };
    // SAFETY: the files are ours, written above, and not modified while mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&safetensors_files(dir), DType::F32, &Device::Cpu)
    }
    .unwrap();
    let mut model = gemma3::Model::new(false, &cfg, vb).unwrap();
    let mut logits = Vec::new();
    for (pos, &token) in tokens.iter().enumerate() {
        let input = Tensor::new(&[token], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        logits = model
            .forward(&input, pos)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
    }
    logits
}

/// candle-transformers' qwen2 over the directory's safetensors: last-position logits.
fn candle_qwen2(dir: &Path, spec: &TinyModelSpec, tokens: &[u32]) -> Vec<f32> {
    use candle_transformers::models::qwen2;
    let cfg = qwen2::Config {
        vocab_size: spec.vocab_size(),
        hidden_size: spec.hidden_size,
        intermediate_size: spec.intermediate_size,
        num_hidden_layers: spec.num_layers,
        num_attention_heads: spec.num_heads,
        num_key_value_heads: spec.num_kv_heads,
        max_position_embeddings: spec.context_length,
        sliding_window: spec.context_length,
        max_window_layers: spec.num_layers,
        tie_word_embeddings: true,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-5f32 as f64,
        use_sliding_window: false,
        hidden_act: candle_nn::Activation::Silu,
    };
    // SAFETY: the files are ours, written above, and not modified while mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&safetensors_files(dir), DType::F32, &Device::Cpu)
    }
    .unwrap();
    let mut model = qwen2::ModelForCausalLM::new(&cfg, vb).unwrap();
    let input = Tensor::new(tokens, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    model
        .forward(&input, 0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn candle_qwen3(dir: &Path, spec: &TinyModelSpec, tokens: &[u32]) -> Vec<f32> {
    use candle_transformers::models::qwen3;
    let cfg = qwen3::Config {
        vocab_size: spec.vocab_size(),
        hidden_size: spec.hidden_size,
        intermediate_size: spec.intermediate_size,
        num_hidden_layers: spec.num_layers,
        num_attention_heads: spec.num_heads,
        head_dim: spec.head_dim(),
        attention_bias: false,
        num_key_value_heads: spec.num_kv_heads,
        max_position_embeddings: spec.context_length,
        sliding_window: None,
        max_window_layers: spec.num_layers,
        tie_word_embeddings: true,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-5f32 as f64,
        use_sliding_window: false,
        hidden_act: candle_nn::Activation::Silu,
    };
    // SAFETY: as above.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&safetensors_files(dir), DType::F32, &Device::Cpu)
    }
    .unwrap();
    let mut model = qwen3::ModelForCausalLM::new(&cfg, vb).unwrap();
    let input = Tensor::new(tokens, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    model
        .forward(&input, 0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

#[test]
fn tiny_qwen2_matches_candle_transformers() {
    let spec = qwen2_spec();
    // Sharded, with an index: three files.
    let export = HfExport {
        shards: 3,
        ..HfExport::default()
    };
    let (_tmp, dir) = tiny_dir(&spec, &export);
    assert_eq!(safetensors_files(&dir).len(), 3);
    assert!(dir.join(WEIGHTS_INDEX_FILE).is_file());
    let ours = last_logits(&load(&dir, WeightsKind::F32), &PROMPT);
    let theirs = candle_qwen2(&dir, &spec, &PROMPT);
    let diff = max_abs_diff(&ours, &theirs);
    assert!(
        diff < 1e-4,
        "qwen2 logits differ from candle-transformers by {diff}"
    );
}

#[test]
fn tiny_qwen3_matches_candle_transformers() {
    let spec = qwen3_spec();
    let (_tmp, dir) = tiny_dir(&spec, &HfExport::default());
    let model = load(&dir, WeightsKind::F32);
    assert_eq!(model.config().architecture, Architecture::Qwen3);
    assert_eq!(model.config().head_dim, 32);
    let ours = last_logits(&model, &PROMPT);
    let theirs = candle_qwen3(&dir, &spec, &PROMPT);
    let diff = max_abs_diff(&ours, &theirs);
    assert!(
        diff < 1e-4,
        "qwen3 logits differ from candle-transformers by {diff}"
    );
}

/// A Gemma 3 text checkpoint (`gemma3_text`: norms stored minus one, `pre_feedforward_layernorm`,
/// `layer_types`, `query_pre_attn_scalar`, `final_logit_softcapping`) against candle-transformers'
/// own gemma3, an independent reading of the same files.
#[test]
fn tiny_gemma3_matches_candle_transformers() {
    let spec = gemma3_spec();
    let (_tmp, dir) = tiny_dir(&spec, &HfExport::default());
    let model = load(&dir, WeightsKind::F32);
    let c = model.config();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!(
        (c.window_of_layer(0), c.window_of_layer(1)),
        (Some(sluice_model::testing::TINY_GEMMA_WINDOW), None)
    );
    // Ten tokens: past the local layer's window of 8.
    let ours = last_logits(&model, &PROMPT);
    let theirs = candle_gemma3(&dir, &spec, &PROMPT);
    let diff = max_abs_diff(&ours, &theirs);
    assert!(
        diff < 1e-4,
        "gemma3 logits differ from candle-transformers by {diff}"
    );
}

/// bf16 checkpoints are converted to f32 on the CPU: the same numbers candle-transformers
/// computes from the same bf16 values.
#[test]
fn bf16_weights_load_as_f32() {
    for spec in [qwen2_spec(), qwen3_spec()] {
        let export = HfExport {
            dtype: DType::BF16,
            shards: 2,
            ..HfExport::default()
        };
        let (_tmp, dir) = tiny_dir(&spec, &export);
        let ours = last_logits(&load(&dir, WeightsKind::F32), &PROMPT);
        let theirs = match spec.architecture {
            Architecture::Qwen2 => candle_qwen2(&dir, &spec, &PROMPT),
            _ => candle_qwen3(&dir, &spec, &PROMPT),
        };
        let diff = max_abs_diff(&ours, &theirs);
        assert!(
            diff < 1e-4,
            "{:?} bf16: differs by {diff}",
            spec.architecture
        );
        // f16 checkpoints too.
        let export = HfExport {
            dtype: DType::F16,
            shards: 1,
            ..HfExport::default()
        };
        let (_tmp, dir) = tiny_dir(&spec, &export);
        assert!(dir.join(WEIGHTS_FILE).is_file());
        let ours = last_logits(&load(&dir, WeightsKind::F32), &PROMPT);
        let theirs = match spec.architecture {
            Architecture::Qwen2 => candle_qwen2(&dir, &spec, &PROMPT),
            _ => candle_qwen3(&dir, &spec, &PROMPT),
        };
        let diff = max_abs_diff(&ours, &theirs);
        assert!(
            diff < 1e-4,
            "{:?} f16: differs by {diff}",
            spec.architecture
        );
    }
}

/// A GGUF file and the HF directory exported from it are the same model: identical logits,
/// and the same tokenizer, stop ids and chat template. Covers llama (Q/K un-permuted), qwen2
/// (biases), qwen3 (QK-norm, own head size), gemma3 (norms minus one, its layer pattern and
/// window) and smollm3 (its layers without RoPE), batched over every weight kind.
#[test]
fn tiny_gguf_and_its_hf_export_agree() {
    for spec in [
        TinyModelSpec::default(),
        qwen2_spec(),
        qwen3_spec(),
        gemma3_spec(),
        smollm3_spec(),
    ] {
        let (tmp, dir) = tiny_dir(
            &spec,
            &HfExport {
                shards: 2,
                ..HfExport::default()
            },
        );
        let gguf = tmp.path().join("tiny.gguf");
        for kind in [WeightsKind::F32, WeightsKind::Auto] {
            let a = last_logits(&load(&gguf, kind), &PROMPT);
            let b = last_logits(&load(&dir, kind), &PROMPT);
            assert_eq!(
                a, b,
                "{:?} {kind}: GGUF and HF logits differ",
                spec.architecture
            );
        }
        // Every weight kind loads from dense tensors and stays close to f32 (`quantized`: Q8_0
        // weights and int8 activations).
        let f32_logits = last_logits(&load(&dir, WeightsKind::F32), &PROMPT);
        for (kind, tol) in [(WeightsKind::F16, 5e-2), (WeightsKind::Quantized, 0.25)] {
            let diff = max_abs_diff(&f32_logits, &last_logits(&load(&dir, kind), &PROMPT));
            assert!(diff < tol, "{:?} {kind}: {diff}", spec.architecture);
        }

        let gguf_source = ModelSource::open(&gguf).unwrap();
        let hf_source = ModelSource::open(&dir).unwrap();
        assert_eq!((gguf_source.format(), hf_source.format()), ("gguf", "hf"));
        let (t1, t2) = (
            gguf_source.tokenizer().unwrap(),
            hf_source.tokenizer().unwrap(),
        );
        for text in [
            "the thin man ran in",
            "<|im_start|>user\nhi<|im_end|>",
            "é 12 ü",
        ] {
            assert_eq!(
                t1.encode(text).unwrap(),
                t2.encode(text).unwrap(),
                "{text:?}"
            );
        }
        assert_eq!(t1.eos_token_ids(), t2.eos_token_ids());
        assert_eq!(t1.chat_template(), t2.chat_template());
        assert_eq!(t1.add_bos_token(), t2.add_bos_token());
    }
}

#[test]
fn generation_config_eos_ids_stop_generation() {
    let (_tmp, dir) = tiny_dir(&TinyModelSpec::default(), &HfExport::default());
    // An id and a list, as checkpoints write them.
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [65, 66]}"#,
    )
    .unwrap();
    let tok = HfModelDir::open(&dir).unwrap().tokenizer().unwrap();
    assert!(tok.eos_token_ids().contains(&65) && tok.eos_token_ids().contains(&66));
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": 67}"#,
    )
    .unwrap();
    let tok = HfModelDir::open(&dir).unwrap().tokenizer().unwrap();
    assert!(tok.eos_token_ids().contains(&67));
    assert!(!tok.eos_token_ids().contains(&65));
}

#[test]
fn rope_scaling_and_tied_embeddings_come_from_config_json() {
    let (_tmp, dir) = tiny_dir(&TinyModelSpec::default(), &HfExport::default());
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let path = dir.join(CONFIG_FILE);
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        f(&mut json);
        std::fs::write(&path, json.to_string()).unwrap();
    };
    edit(&|j| j["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0}));
    let model = load(&dir, WeightsKind::F32);
    assert_eq!(
        model.config().rope_scaling,
        Some(RopeScaling::Linear { factor: 2.0 })
    );
    edit(&|j| {
        j["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
    });
    let model = load(&dir, WeightsKind::F32);
    assert!(matches!(
        model.config().rope_scaling,
        Some(RopeScaling::FreqFactors(ref f)) if f.len() == 8
    ));
    last_logits(&model, &PROMPT);

    // Untied: the config asks for lm_head.weight, which this checkpoint lacks.
    edit(&|j| j["tie_word_embeddings"] = false.into());
    let err = LlamaModel::load(&dir, &options(WeightsKind::F32))
        .err()
        .expect("no lm_head.weight");
    assert!(
        matches!(&err, ModelError::MissingTensor { name, .. } if name == "lm_head.weight"),
        "{err}"
    );
}

/// Rewrites the single safetensors file of `dir` through `f`.
fn rewrite_weights(dir: &Path, f: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let path = dir.join(WEIGHTS_FILE);
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    f(&mut tensors);
    candle_core::safetensors::save(&tensors, &path).unwrap();
}

#[test]
fn bad_directories_are_errors_naming_the_cause() {
    let msg = |path: &Path| match LlamaModel::load(path, &options(WeightsKind::F32)) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    };
    let fresh = || tiny_dir(&TinyModelSpec::default(), &HfExport::default());

    let (_t, dir) = fresh();
    std::fs::remove_file(dir.join(CONFIG_FILE)).unwrap();
    let m = msg(&dir);
    assert!(m.contains("config.json") && m.contains("tiny"), "{m}");

    let (_t, dir) = fresh();
    std::fs::write(dir.join(CONFIG_FILE), "{not json").unwrap();
    let m = msg(&dir);
    assert!(
        m.contains("config.json") && m.contains("invalid JSON"),
        "{m}"
    );

    let (_t, dir) = fresh();
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap();
    std::fs::write(
        dir.join(CONFIG_FILE),
        text.replace("\"llama\"", "\"gemma3\"")
            .replace("LlamaForCausalLM", "Gemma3ForCausalLM"),
    )
    .unwrap();
    let m = msg(&dir);
    assert!(m.contains("config.json") && m.contains("`gemma3`"), "{m}");

    let (_t, dir) = fresh();
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap();
    std::fs::write(
        dir.join(CONFIG_FILE),
        text.replace("\"num_hidden_layers\"", "\"n_layers\""),
    )
    .unwrap();
    let m = msg(&dir);
    assert!(
        m.contains("config.json") && m.contains("num_hidden_layers"),
        "{m}"
    );

    let (_t, dir) = fresh();
    rewrite_weights(&dir, |t| {
        t.remove("model.layers.1.mlp.up_proj.weight");
    });
    let m = msg(&dir);
    assert!(
        m.contains("`model.layers.1.mlp.up_proj.weight` is missing"),
        "{m}"
    );

    let (_t, dir) = fresh();
    rewrite_weights(&dir, |t| {
        t.insert(
            "model.layers.0.self_attn.k_proj.weight".into(),
            Tensor::zeros((16, 64), DType::F32, &Device::Cpu).unwrap(),
        );
    });
    let m = msg(&dir);
    assert!(
        m.contains("model.safetensors")
            && m.contains("`model.layers.0.self_attn.k_proj.weight`")
            && m.contains("[16, 64]")
            && m.contains("[32, 64]"),
        "{m}"
    );

    let (_t, dir) = fresh();
    rewrite_weights(&dir, |t| {
        let w = t.remove("model.norm.weight").unwrap();
        t.insert("model.norm.weight".into(), w.to_dtype(DType::U32).unwrap());
    });
    let m = msg(&dir);
    assert!(m.contains("model.norm.weight") && m.contains("U32"), "{m}");

    let (_t, dir) = fresh();
    std::fs::remove_file(dir.join(WEIGHTS_FILE)).unwrap();
    let m = msg(&dir);
    assert!(m.contains("no weights"), "{m}");

    let (_t, dir) = fresh();
    std::fs::write(dir.join(WEIGHTS_FILE), b"garbage").unwrap();
    let m = msg(&dir);
    assert!(
        m.contains("model.safetensors") && m.contains("not a valid safetensors"),
        "{m}"
    );

    // An index naming a shard that is not there.
    let (_t, dir) = tiny_dir(
        &TinyModelSpec::default(),
        &HfExport {
            shards: 2,
            ..HfExport::default()
        },
    );
    std::fs::remove_file(&safetensors_files(&dir)[1]).unwrap();
    let m = msg(&dir);
    assert!(
        m.contains("model-00002-of-00002.safetensors") && m.contains("missing"),
        "{m}"
    );

    let (_t, dir) = fresh();
    std::fs::remove_file(dir.join(TOKENIZER_FILE)).unwrap();
    let m = ModelSource::open(&dir)
        .unwrap()
        .tokenizer()
        .unwrap_err()
        .to_string();
    assert!(m.contains("tokenizer.json"), "{m}");
}

/// The real SmolLM2: exported from its GGUF file (dequantized to f32, renamed, Q/K
/// un-permuted, tokenizer.json written from its vocabulary), the directory tokenizes every
/// fixture text as llama.cpp does and generates the GGUF file's greedy tokens.
#[test]
fn smollm2_hf_export_generates_the_gguf_tokens() {
    let gguf = model_path();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("SmolLM2-135M-Instruct");
    write_hf_from_gguf(
        &gguf,
        &dir,
        &HfExport {
            dtype: DType::F32,
            shards: 2,
            ..HfExport::default()
        },
    )
    .unwrap();

    let hf = ModelSource::open(&dir).unwrap();
    let tok = hf.tokenizer().unwrap();
    for row in read_jsonl("smollm2-tokenize.jsonl") {
        let text = row["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids(&row["ids"]), "{text:?}");
    }
    let gguf_tok = ModelSource::open(&gguf).unwrap().tokenizer().unwrap();
    assert_eq!(tok.eos_token_ids(), gguf_tok.eos_token_ids());
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.chat_template(), gguf_tok.chat_template());

    let gguf_model = load(&gguf, WeightsKind::F32);
    let hf_model = load(&dir, WeightsKind::F32);
    assert_eq!(gguf_model.config(), hf_model.config());
    for prompt in [
        "The capital of France is",
        "def fibonacci(n):",
        "<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n<|im_start|>assistant\n",
    ] {
        let ids = tok.encode(prompt).unwrap();
        assert_eq!(ids, gguf_tok.encode(prompt).unwrap());
        let (a, la) = greedy(&gguf_model, &ids, 12);
        let (b, lb) = greedy(&hf_model, &ids, 12);
        assert_eq!(
            a,
            b,
            "{prompt:?}: {:?} vs {:?}",
            tok.decode(&a, false),
            tok.decode(&b, false)
        );
        for (x, y) in la.iter().zip(&lb) {
            assert!(max_abs_diff(x, y) < 1e-4);
        }
    }
    let (paris, _) = greedy(
        &hf_model,
        &tok.encode("The capital of France is").unwrap(),
        2,
    );
    assert_eq!(tok.decode(&paris, false), " Paris.");
}

/// `ModelSource::model_config` agrees with the directory's config, and `Tokenizer::from_file`
/// reads the exported tokenizer.json as the GGUF vocabulary encodes.
#[test]
fn exported_tokenizer_json_round_trips() {
    let (_tmp, dir) = tiny_dir(&TinyModelSpec::default(), &HfExport::default());
    let mut source = ModelSource::open(&dir).unwrap();
    let config = source.model_config().unwrap();
    assert_eq!(config.num_layers, 2);
    assert!(config.tie_word_embeddings);
    let tok = Tokenizer::from_file(&dir.join(TOKENIZER_FILE)).unwrap();
    assert_eq!(
        tok.decode(&tok.encode("the thin").unwrap(), false),
        "the thin"
    );
}
