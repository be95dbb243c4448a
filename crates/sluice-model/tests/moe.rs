//! Mixtures of experts (Mixtral, qwen2moe, qwen3moe) on tiny random-weight files written here:
//! the Hugging Face layouts (each expert's own matrices, and transformers 5's fused 3-D
//! tensors) give exactly what the GGUF file gives; the experts do change the output; bad
//! files are errors naming the key or tensor. Batching (`batch_invariance.rs`) and llama.cpp's
//! numbers (`moe_fidelity.rs`) are checked elsewhere.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::Shape;
use common::prefill_logit_bits;
use sluice_model::testing::{
    optional_model, write_hf_from_gguf, HfExperts, HfExport, TinyModelSpec, TinyMoe,
};
use sluice_model::{Architecture, GgufFile, HfModelDir, LlamaModel, LoadOptions, WeightsKind};

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec(architecture: Architecture, dtype: GgmlDType) -> TinyModelSpec {
    TinyModelSpec {
        architecture,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 2,
        dtype,
        moe: Some(TinyMoe::new(architecture, 6, 2, 32)),
        ..TinyModelSpec::default()
    }
}

const ARCHS: [(Architecture, &str); 3] = [
    (Architecture::Llama, "mixtral"),
    (Architecture::Qwen2Moe, "qwen2moe"),
    (Architecture::Qwen3Moe, "qwen3moe"),
];

fn write(spec: &TinyModelSpec, name: &str) -> PathBuf {
    let path = dir().join(format!("{name}.gguf"));
    spec.write_gguf(&path).unwrap();
    path
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..23)
        .map(|i| (i * 37 + 11) as u32 % vocab as u32)
        .collect()
}

#[test]
fn hugging_face_layouts_give_the_gguf_files_logits() {
    for (arch, name) in ARCHS {
        let spec = spec(arch, GgmlDType::F32);
        let gguf = write(&spec, name);
        let want = prefill_logit_bits(
            &LlamaModel::load(&gguf, &LoadOptions::default()).unwrap(),
            &prompt(spec.vocab_size()),
        );
        for experts in [HfExperts::PerExpert, HfExperts::Fused] {
            let hf = dir().join(format!("{name}-{experts:?}"));
            let export = HfExport {
                experts,
                ..HfExport::default()
            };
            write_hf_from_gguf(&gguf, &hf, &export).unwrap();
            let opened = HfModelDir::open(&hf).unwrap();
            assert_eq!(opened.config().architecture, arch);
            assert_eq!(
                opened.config().moe,
                GgufFile::open(&gguf).unwrap().model_config().unwrap().moe,
                "{name} {experts:?}: the HF config's mixture"
            );
            let model = LlamaModel::from_hf(&opened, &LoadOptions::default()).unwrap();
            assert!(
                prefill_logit_bits(&model, &prompt(spec.vocab_size())) == want,
                "{name} in the {experts:?} layout: logits differ from the GGUF file's"
            );
        }
    }
}

/// gpt-oss's Hugging Face checkpoints, the MXFP4 experts as released and their dequantized
/// layout (`scripts/tiny-gpt-oss-hf.py`: the tiny gpt-oss's numbers in transformers' names and
/// layouts, gate and up interleaved, blocks in transformers' nibble order): the same config and
/// every logit of a prompt that crosses the window, bit for bit the GGUF file's, under each
/// kind of weights. Without the files the test says that it skipped and which script makes
/// them.
#[test]
fn gpt_oss_hugging_face_checkpoints_give_the_gguf_files_logits() {
    let optional =
        |name: &str| optional_model(&format!("tiny-moe/{name}"), "scripts/make-moe-models.sh");
    for (hf, gguf) in [
        ("gpt-oss-hf-mxfp4", "gpt-oss-mxfp4.gguf"),
        ("gpt-oss-hf-f32", "gpt-oss-f32.gguf"),
    ] {
        let (Some(weights), Some(gguf)) =
            (optional(&format!("{hf}/model.safetensors")), optional(gguf))
        else {
            continue;
        };
        let opened = HfModelDir::open(weights.parent().unwrap()).unwrap();
        let file_config = GgufFile::open(&gguf).unwrap().model_config().unwrap();
        // GGUF holds the epsilon in f32 (the forward's precision), and a dense MLP size the
        // all-experts gpt-oss never uses (tiny-moe.py writes one unlike the experts').
        let mut config = opened.config().clone();
        assert_eq!(config.rms_norm_eps as f32, file_config.rms_norm_eps as f32);
        config.rms_norm_eps = file_config.rms_norm_eps;
        config.intermediate_size = file_config.intermediate_size;
        assert_eq!(
            config, file_config,
            "{hf}: config.json against the GGUF file"
        );
        let prompt = prompt(file_config.vocab_size);
        for kind in [WeightsKind::Auto, WeightsKind::Exact, WeightsKind::F32] {
            let options = LoadOptions {
                weights: kind,
                ..LoadOptions::default()
            };
            let want = prefill_logit_bits(&LlamaModel::load(&gguf, &options).unwrap(), &prompt);
            let got = prefill_logit_bits(&LlamaModel::from_hf(&opened, &options).unwrap(), &prompt);
            assert!(
                got == want,
                "{hf} under {kind:?}: logits differ from {}",
                gguf.display()
            );
        }
    }
}

/// A gpt-oss config.json or checkpoint that sluice cannot serve as written is an error naming
/// the key or tensor: another SwiGLU limit, another quantization, no window, DeepSeek's YaRN,
/// a missing MXFP4 scale tensor.
#[test]
fn bad_gpt_oss_checkpoints_are_errors_naming_the_key_or_tensor() {
    let Some(weights) = optional_model(
        "tiny-moe/gpt-oss-hf-mxfp4/model.safetensors",
        "scripts/make-moe-models.sh",
    ) else {
        return;
    };
    let source = weights.parent().unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap())
            .unwrap();
    let error_with = |edit: &dyn Fn(&mut serde_json::Value), tensors: &Path| -> String {
        let d = dir().join(format!("bad-oss-hf-{}", rand_suffix()));
        std::fs::create_dir_all(&d).unwrap();
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
        std::os::unix::fs::symlink(tensors, d.join("model.safetensors")).unwrap();
        match HfModelDir::open(&d)
            .and_then(|opened| LlamaModel::from_hf(&opened, &LoadOptions::default()))
        {
            Ok(_) => panic!("{c} loaded"),
            Err(e) => e.to_string(),
        }
    };
    let set = |key: &'static str, value: serde_json::Value| {
        move |c: &mut serde_json::Value| c[key] = value.clone()
    };
    for (edit, names) in [
        (
            Box::new(set("swiglu_limit", 10.0.into())) as Box<dyn Fn(&mut serde_json::Value)>,
            &["swiglu_limit"][..],
        ),
        (
            Box::new(set(
                "quantization_config",
                serde_json::json!({"quant_method": "fp8"}),
            )),
            &["quant_method", "fp8"],
        ),
        (
            Box::new(set("sliding_window", serde_json::Value::Null)),
            &["sliding_window"],
        ),
        (
            Box::new(|c: &mut serde_json::Value| c["rope_scaling"]["mscale"] = 1.0.into()),
            &["rope_scaling.mscale"],
        ),
        (
            Box::new(|c: &mut serde_json::Value| c["layer_types"] = serde_json::json!(["x"])),
            &["layer_types"],
        ),
    ] {
        let e = error_with(&edit, &weights);
        for name in names {
            assert!(e.contains(name), "{e} should name {name}");
        }
    }
    // Experts of another size: the tensor of either layout is named.
    let f32_weights = source
        .parent()
        .unwrap()
        .join("gpt-oss-hf-f32/model.safetensors");
    let smaller = |c: &mut serde_json::Value| c["intermediate_size"] = 128.into();
    for (tensors, name) in [
        (&weights, "mlp.experts.gate_up_proj_blocks"),
        (&f32_weights, "mlp.experts.gate_up_proj"),
    ] {
        let e = error_with(&smaller, tensors);
        assert!(e.contains(name) && e.contains("shape"), "{e}");
    }
}

/// A name no other test of this process uses.
fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

#[test]
fn the_experts_change_the_output() {
    // The same file with the experts' down matrices zeroed: the logits move, so the mixture
    // is not a no-op the other checks could pass with.
    for (arch, name) in ARCHS {
        let spec = spec(arch, GgmlDType::F32);
        let gguf = write(&spec, &format!("{name}-live"));
        let model = LlamaModel::load(&gguf, &LoadOptions::default()).unwrap();
        let config = model.config().clone();
        let moe = config.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_used), (6, 2));
        assert!(config.active_parameters() < config.num_parameters());
        let base = prefill_logit_bits(&model, &prompt(spec.vocab_size()));

        let mut file = GgufFile::open(&gguf).unwrap();
        let meta = &mut file.content.metadata;
        // k = every expert: other weights, other logits.
        meta.insert(format!("{}.expert_used_count", arch.name()), Value::U32(6));
        let all = LlamaModel::from_gguf(&mut file, &LoadOptions::default()).unwrap();
        assert!(
            prefill_logit_bits(&all, &prompt(spec.vocab_size())) != base,
            "{name}: running every expert gave the logits of running two"
        );
    }
}

/// The error of loading `file` after `edit`, as text.
fn error_after(path: &PathBuf, edit: impl FnOnce(&mut GgufFile)) -> String {
    let mut file = GgufFile::open(path).unwrap();
    edit(&mut file);
    match LlamaModel::from_gguf(&mut file, &LoadOptions::default()) {
        Ok(_) => panic!("{}: the edited file loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_mixtures_are_errors_naming_the_key_or_tensor() {
    let path = write(&spec(Architecture::Qwen3Moe, GgmlDType::Q8_0), "bad-src");
    let set = |key: &'static str, v: Value| {
        move |f: &mut GgufFile| {
            f.content.metadata.insert(key.into(), v);
        }
    };
    for (edit, names) in [
        (
            Box::new(set("qwen3moe.expert_used_count", Value::U32(0))) as Box<dyn FnOnce(&mut _)>,
            &["qwen3moe.expert_used_count", "between 1 and"][..],
        ),
        (
            Box::new(set("qwen3moe.expert_used_count", Value::U32(7))),
            &["qwen3moe.expert_used_count", "6 experts"],
        ),
        (
            Box::new(set("qwen3moe.expert_count", Value::U32(0))),
            &["qwen3moe.expert_count"],
        ),
        (
            Box::new(|f: &mut GgufFile| {
                f.content.metadata.remove("qwen3moe.expert_count");
            }),
            &["qwen3moe.expert_count", "mixture of experts"],
        ),
        (
            Box::new(set("qwen3moe.expert_gating_func", Value::U32(2))),
            &["qwen3moe.expert_gating_func"],
        ),
        (
            // The file holds 6 experts; the header says 8.
            Box::new(set("qwen3moe.expert_count", Value::U32(8))),
            &["blk.0.ffn_gate_inp.weight", "[8, 64]"],
        ),
        (
            Box::new(|f: &mut GgufFile| {
                f.content.tensor_infos.remove("blk.1.ffn_up_exps.weight");
            }),
            &["blk.1.ffn_up_exps.weight", "missing"],
        ),
        (
            // Five experts' worth of rows where the header says six.
            Box::new(|f: &mut GgufFile| {
                let info = f
                    .content
                    .tensor_infos
                    .get_mut("blk.0.ffn_down_exps.weight")
                    .unwrap();
                info.shape = Shape::from_dims(&[5, 64, 32]);
            }),
            &["blk.0.ffn_down_exps.weight", "[6, 64, 32]", "[5, 64, 32]"],
        ),
    ] {
        let msg = error_after(&path, edit);
        for part in names {
            assert!(msg.contains(part), "the error should name {part}: {msg}");
        }
    }
}

/// gpt-oss's own parts, missing or wrong, are errors naming the key or tensor: sinks, biases,
/// the window, the rope scaling.
#[test]
fn bad_gpt_oss_files_are_errors_naming_the_key_or_tensor() {
    let path = write(&spec(Architecture::GptOss, GgmlDType::Q8_0), "bad-oss");
    // The file itself loads.
    let model = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
    assert!(model.config().sliding_window.is_some());
    let set = |key: &'static str, v: Value| {
        move |f: &mut GgufFile| {
            f.content.metadata.insert(key.into(), v);
        }
    };
    let remove = |name: &'static str| {
        move |f: &mut GgufFile| {
            f.content.tensor_infos.remove(name);
        }
    };
    for (edit, names) in [
        (
            Box::new(remove("blk.1.attn_sinks.weight")) as Box<dyn FnOnce(&mut _)>,
            &["blk.1.attn_sinks.weight", "missing"][..],
        ),
        (
            Box::new(remove("blk.0.attn_output.bias")),
            &["blk.0.attn_output.bias", "missing"],
        ),
        (
            Box::new(remove("blk.0.ffn_gate_inp.bias")),
            &["blk.0.ffn_gate_inp.bias", "missing"],
        ),
        (
            Box::new(remove("blk.1.ffn_down_exps.bias")),
            &["blk.1.ffn_down_exps.bias", "missing"],
        ),
        (
            Box::new(|f: &mut GgufFile| {
                let info = f
                    .content
                    .tensor_infos
                    .get_mut("blk.0.attn_sinks.weight")
                    .unwrap();
                info.shape = Shape::from_dims(&[3]);
            }),
            &["blk.0.attn_sinks.weight", "[4]", "[3]"],
        ),
        (
            Box::new(set("gpt-oss.attention.sliding_window", Value::U32(0))),
            &["gpt-oss.attention.sliding_window"],
        ),
        (
            Box::new(|f: &mut GgufFile| {
                f.content
                    .metadata
                    .remove("gpt-oss.attention.sliding_window");
            }),
            &["gpt-oss.attention.sliding_window"],
        ),
        (
            Box::new(set(
                "gpt-oss.rope.scaling.type",
                Value::String("longrope".into()),
            )),
            &["longrope", "yarn"],
        ),
        (
            Box::new(set("gpt-oss.rope.scaling.factor", Value::F32(0.0))),
            &["gpt-oss.rope.scaling.factor"],
        ),
    ] {
        let msg = error_after(&path, edit);
        for part in names {
            assert!(msg.contains(part), "the error should name {part}: {msg}");
        }
    }
}
