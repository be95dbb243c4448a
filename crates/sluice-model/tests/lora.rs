//! LoRA adapters on tiny random-weight models: PEFT's directory and llama.cpp's GGUF adapter
//! of the same numbers give the same logits bit for bit (llama's permuted Q/K rows included);
//! an adapted row gives the same logits alone and in a step mixing other adapters and the
//! base; the base with an adapter agrees with the adapter merged into the weights
//! (`W + alpha/r B A`, written as a new checkpoint); bad adapters are refused naming the
//! problem.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};
use sluice_model::testing::{write_hf_from_gguf, HfExport, TinyLoraSpec, TinyModelSpec, TinyMoe};
use sluice_model::{Architecture, HfModelDir, LlamaModel, LoadOptions, LoraProjection, StepBatch};

const BLOCK: usize = 16;
const MAX_RANK: usize = 64;

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("sluice-lora-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec(architecture: Architecture) -> TinyModelSpec {
    TinyModelSpec {
        architecture,
        seed: 11,
        ..TinyModelSpec::default()
    }
}

fn adapter_spec(seed: u64) -> TinyLoraSpec {
    TinyLoraSpec {
        rank: 8,
        alpha: 16.0,
        targets: LoraProjection::ALL.to_vec(),
        seed,
    }
}

fn gguf(spec: &TinyModelSpec, name: &str) -> PathBuf {
    let path = dir(name).join("model.gguf");
    spec.write_gguf(&path).unwrap();
    path
}

fn prompt(len: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 31 + salt * 7 + 3) % vocab as u32)
        .collect()
}

/// The last token's logits (as bits) of each `(tokens, slot)` sequence, all in one prefill
/// step.
fn logits(model: &LlamaModel, seqs: &[(&[u32], u16)]) -> Vec<Vec<u32>> {
    let blocks: usize = seqs.iter().map(|(t, _)| t.len().div_ceil(BLOCK)).sum();
    let mut kv = model.new_kv_cache(blocks, BLOCK).unwrap();
    let mut batch = StepBatch::new(BLOCK);
    let mut next = 0u32;
    for (tokens, slot) in seqs {
        let n = tokens.len().div_ceil(BLOCK) as u32;
        let table: Vec<u32> = (next..next + n).collect();
        next += n;
        batch.push_sequence(tokens, 0, &table, true);
        batch
            .lora_slots
            .extend(std::iter::repeat_n(*slot, tokens.len()));
    }
    if batch.lora_slots.iter().all(|&s| s == 0) {
        batch.lora_slots.clear();
    }
    model
        .forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
        .into_iter()
        .map(|r| r.into_iter().map(f32::to_bits).collect())
        .collect()
}

fn load(path: &Path) -> LlamaModel {
    LlamaModel::load(path, &LoadOptions::default()).unwrap()
}

#[test]
fn peft_and_gguf_adapters_give_the_same_logits() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let spec = spec(arch);
        let path = gguf(&spec, &format!("same-{}", arch.name()));
        let mut model = load(&path);
        let config = model.config().clone();
        let lora = adapter_spec(5);
        let peft = dir(&format!("same-{}-peft", arch.name()));
        lora.write_peft(&config, &peft).unwrap();
        let gguf_adapter = dir(&format!("same-{}-gguf", arch.name())).join("adapter.gguf");
        lora.write_gguf(&config, &gguf_adapter).unwrap();
        let from_peft = model.load_adapter(&peft, MAX_RANK).unwrap();
        let from_gguf = model.load_adapter(&gguf_adapter, MAX_RANK).unwrap();
        assert_eq!((from_peft.rank(), from_gguf.rank()), (8, 8));
        assert_eq!(from_peft.scale(), 2.0);
        assert_eq!(from_gguf.scale(), 2.0);
        model.set_adapter(1, Some(Arc::new(from_peft))).unwrap();
        model.set_adapter(2, Some(Arc::new(from_gguf))).unwrap();
        let tokens = prompt(21, 1, spec.vocab_size());
        let out = logits(&model, &[(&tokens, 0), (&tokens, 1), (&tokens, 2)]);
        assert_ne!(
            out[0],
            out[1],
            "{}: the adapter changes nothing",
            arch.name()
        );
        assert!(
            out[1] == out[2],
            "{}: PEFT and GGUF copies of one adapter differ",
            arch.name()
        );
    }
}

#[test]
fn an_adapted_row_is_the_same_alone_and_among_other_adapters() {
    let spec = spec(Architecture::Llama);
    let path = gguf(&spec, "mixed");
    let mut model = load(&path);
    let config = model.config().clone();
    for (slot, seed) in [(1u16, 21u64), (2, 22), (3, 23)] {
        let d = dir(&format!("mixed-{slot}"));
        adapter_spec(seed).write_peft(&config, &d).unwrap();
        let adapter = model.load_adapter(&d, MAX_RANK).unwrap();
        model.set_adapter(slot, Some(Arc::new(adapter))).unwrap();
    }
    let vocab = spec.vocab_size();
    let prompts: Vec<(Vec<u32>, u16)> = [(5, 1), (17, 0), (33, 2), (9, 3), (12, 1), (3, 0)]
        .iter()
        .enumerate()
        .map(|(i, &(len, slot))| (prompt(len, i as u32, vocab), slot))
        .collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|(t, slot)| logits(&model, &[(t, *slot)]).remove(0))
        .collect();
    let together = logits(
        &model,
        &prompts
            .iter()
            .map(|(t, s)| (t.as_slice(), *s))
            .collect::<Vec<_>>(),
    );
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert!(
            a == b,
            "sequence {i} (slot {}) differs in a crowd",
            prompts[i].1
        );
    }
    // Emptying a slot leaves the base; the base rows never changed.
    let base_row = logits(&model, &[(&prompts[1].0, 0)]).remove(0);
    assert!(base_row == alone[1]);
    model.set_adapter(2, None).unwrap();
    let mut kv = model.new_kv_cache(4, BLOCK).unwrap();
    let mut batch = StepBatch::new(BLOCK);
    batch.push_sequence(&prompts[2].0, 0, &[0, 1, 2], true);
    batch.lora_slots = vec![2; prompts[2].0.len()];
    let e = model.forward(&batch, &mut kv).unwrap_err().to_string();
    assert!(e.contains("slot 2"), "{e}");
}

/// The same adapter merged into the weights (`W + alpha/r B A`, a new Hugging Face
/// checkpoint): the same greedy tokens, the logits within float rounding.
#[test]
fn the_adapter_merged_into_the_weights_agrees() {
    let spec = spec(Architecture::Qwen2);
    let path = gguf(&spec, "merged");
    let base_dir = dir("merged-base");
    write_hf_from_gguf(&path, &base_dir, &HfExport::default()).unwrap();
    let mut model = LlamaModel::from_hf(
        &HfModelDir::open(&base_dir).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    let config = model.config().clone();
    let peft = dir("merged-peft");
    adapter_spec(9).write_peft(&config, &peft).unwrap();
    let adapter = model.load_adapter(&peft, MAX_RANK).unwrap();

    let merged_dir = dir("merged-weights");
    for entry in std::fs::read_dir(&base_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), merged_dir.join(entry.file_name())).unwrap();
    }
    let weights = merged_dir.join("model.safetensors");
    let mut tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
    for layer in 0..config.num_layers {
        for p in LoraProjection::ALL {
            let module = match p {
                LoraProjection::Gate | LoraProjection::Up | LoraProjection::Down => "mlp",
                _ => "self_attn",
            };
            let name = format!("model.layers.{layer}.{module}.{}.weight", p.peft_name());
            let w = &tensors[&name];
            let shape = w.dims().to_vec();
            let values = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let merged = adapter.merged(layer, p, &values);
            tensors.insert(name, Tensor::from_vec(merged, shape, &Device::Cpu).unwrap());
        }
    }
    candle_core::safetensors::save(&tensors, &weights).unwrap();
    let merged = LlamaModel::from_hf(
        &HfModelDir::open(&merged_dir).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    model.set_adapter(1, Some(Arc::new(adapter))).unwrap();

    let mut tokens = prompt(12, 4, spec.vocab_size());
    let mut merged_tokens = tokens.clone();
    let mut worst = 0f32;
    let argmax = |bits: &[u32]| {
        bits.iter()
            .map(|&b| f32::from_bits(b))
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap()
            .0 as u32
    };
    for _ in 0..16 {
        let with_adapter = logits(&model, &[(&tokens, 1)]).remove(0);
        let with_merged = logits(&merged, &[(&merged_tokens, 0)]).remove(0);
        for (a, b) in with_adapter.iter().zip(&with_merged) {
            worst = worst.max((f32::from_bits(*a) - f32::from_bits(*b)).abs());
        }
        tokens.push(argmax(&with_adapter));
        merged_tokens.push(argmax(&with_merged));
    }
    eprintln!("largest logit difference, adapter against merged weights: {worst:e}");
    assert_eq!(tokens, merged_tokens);
    assert!(worst < 1e-3, "{worst}");
}

fn load_error(model: &LlamaModel, path: &Path, max_rank: usize) -> String {
    match model.load_adapter(path, max_rank) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_adapters_are_refused_naming_the_problem() {
    let spec = spec(Architecture::Llama);
    let path = gguf(&spec, "bad");
    let model = load(&path);
    let config = model.config().clone();
    let good = dir("bad-good");
    adapter_spec(3).write_peft(&config, &good).unwrap();
    // A rank above the limit.
    let e = load_error(&model, &good, 4);
    assert!(e.contains("rank 8") && e.contains("max-lora-rank"), "{e}");

    // A missing half, a config that names a module the model lacks, DoRA.
    let edit = |name: &str, f: &dyn Fn(&Path)| -> String {
        let d = dir(name);
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(good.join(file), d.join(file)).unwrap();
        }
        f(&d);
        load_error(&model, &d, MAX_RANK)
    };
    let e = edit("bad-missing", &|d| {
        let file = d.join("adapter_model.safetensors");
        let mut t: HashMap<String, Tensor> =
            candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
        t.remove("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
        candle_core::safetensors::save(&t, &file).unwrap();
    });
    assert!(e.contains("layer 1's v_proj lora_B is missing"), "{e}");
    let config_edit = |name: &str, key: &'static str, value: serde_json::Value| {
        edit(name, &move |d: &Path| {
            let file = d.join("adapter_config.json");
            let mut c: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            c[key] = value.clone();
            std::fs::write(&file, c.to_string()).unwrap();
        })
    };
    let e = config_edit(
        "bad-target",
        "target_modules",
        serde_json::json!(["q_proj", "c_attn"]),
    );
    assert!(
        e.contains("`c_attn`") && e.contains("target_modules"),
        "{e}"
    );
    let e = config_edit("bad-dora", "use_dora", serde_json::json!(true));
    assert!(e.contains("use_dora"), "{e}");
    let e = config_edit("bad-rank", "r", serde_json::json!(4));
    assert!(e.contains("rank 8") && e.contains("`r` is 4"), "{e}");

    // An adapter made for a model of another size.
    let bigger = TinyModelSpec {
        hidden_size: 128,
        ..spec.clone()
    };
    let other = LlamaModel::load(gguf(&bigger, "bad-bigger"), &LoadOptions::default()).unwrap();
    let e = load_error(&other, &good, MAX_RANK);
    assert!(e.contains("has shape") && e.contains("expected"), "{e}");

    // A GGUF adapter of another architecture.
    let qwen = load(&gguf(&self::spec(Architecture::Qwen2), "bad-qwen"));
    let gguf_adapter = dir("bad-gguf").join("adapter.gguf");
    adapter_spec(3).write_gguf(&config, &gguf_adapter).unwrap();
    let e = load_error(&qwen, &gguf_adapter, MAX_RANK);
    assert!(e.contains("general.architecture"), "{e}");

    // The MLP of a mixture of experts.
    let moe_spec = TinyModelSpec {
        moe: Some(TinyMoe::new(Architecture::Llama, 4, 2, 64)),
        ..spec.clone()
    };
    let moe = load(&gguf(&moe_spec, "bad-moe"));
    let e = load_error(&moe, &good, MAX_RANK);
    assert!(e.contains("mixture-of-experts"), "{e}");
    let attention_only = dir("bad-moe-attention");
    TinyLoraSpec {
        targets: vec![LoraProjection::Q, LoraProjection::V],
        ..adapter_spec(3)
    }
    .write_peft(moe.config(), &attention_only)
    .unwrap();
    assert!(moe.load_adapter(&attention_only, MAX_RANK).is_ok());
}
