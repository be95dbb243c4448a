//! `sluice synth`'s checkpoints (`sluice_model::synthetic`): a random-weight GGUF of a real
//! shape, in a plain and a mixed format, opens as the real model's shape would, tokenizes and
//! detokenizes with its byte-level vocabulary, and runs a step with finite logits.

use sluice_model::synthetic::{SyntheticFormat, SyntheticSpec};
use sluice_model::{LlamaModel, LoadOptions, ModelSource, StepBatch, WeightsKind};

fn write(shape: &str, format: &str, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join(format!("{shape}-{format}.gguf"));
    let spec = SyntheticSpec {
        shape: shape.parse().unwrap(),
        format: format.parse::<SyntheticFormat>().unwrap(),
        num_layers: Some(2),
        seed: 3,
    };
    assert!(spec.write_gguf(&path).unwrap() > 0);
    path
}

#[test]
fn a_synthetic_checkpoint_loads_tokenizes_and_steps() {
    let dir = tempfile::tempdir().unwrap();
    for format in ["q4_k_m", "bf16", "q4_1"] {
        let path = write("smollm2-135m", format, &dir);
        let source = ModelSource::open(&path).unwrap();
        let tokenizer = source.tokenizer().unwrap();
        let ids = tokenizer.encode("hello, world").unwrap();
        assert_eq!(
            ids.len(),
            "hello, world".len(),
            "one token a byte: no merges"
        );
        assert_eq!(tokenizer.decode(&ids, true), "hello, world");

        for weights in [WeightsKind::Auto, WeightsKind::Quantized] {
            let options = LoadOptions {
                weights,
                ..LoadOptions::default()
            };
            let model = LlamaModel::load(&path, &options).unwrap();
            let cfg = model.config();
            assert_eq!(
                (
                    cfg.hidden_size,
                    cfg.num_layers,
                    cfg.num_heads,
                    cfg.num_kv_heads
                ),
                (576, 2, 9, 3)
            );
            assert_eq!(cfg.vocab_size, 49152);
            let mut kv = model.new_kv_cache(4, 16).unwrap();
            let mut batch = StepBatch::new(16);
            batch.push_sequence(&ids, 0, &[0], true);
            let logits = model.forward(&batch, &mut kv).unwrap();
            let logits = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(logits.len(), 49152);
            assert!(logits.iter().all(|x| x.is_finite()), "{format} {weights}");
        }
    }
}

#[test]
fn q4_k_m_keeps_llama_cpp_s_mix_where_rows_split_into_super_blocks() {
    // Qwen2.5-1.5B's rows (1536, 8960) split into 256-value super-blocks: Q4_K, with Q6_K for
    // V and down in the first layers; one layer is enough to see both.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen.gguf");
    let spec = SyntheticSpec {
        shape: "qwen2.5-1.5b".parse().unwrap(),
        format: SyntheticFormat::Q4KM,
        num_layers: Some(1),
        seed: 1,
    };
    spec.write_gguf(&path).unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let dtype = |name: &str| content.tensor_infos[name].ggml_dtype;
    use candle_core::quantized::GgmlDType;
    assert_eq!(dtype("blk.0.attn_q.weight"), GgmlDType::Q4K);
    assert_eq!(dtype("blk.0.attn_v.weight"), GgmlDType::Q6K);
    assert_eq!(dtype("blk.0.ffn_down.weight"), GgmlDType::Q6K);
    assert_eq!(dtype("blk.0.ffn_up.weight"), GgmlDType::Q4K);
    assert!(content.tensor_infos.contains_key("blk.0.attn_q.bias"));
    assert!(
        !content.tensor_infos.contains_key("output.weight"),
        "tied, as the real model"
    );
}

/// The Qwen3.6 hybrids' shapes: four layers (three Gated DeltaNet, one gated full attention)
/// load as the real model's would and step with finite logits.
#[test]
fn a_synthetic_hybrid_loads_and_steps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3.6-27b.gguf");
    let spec = SyntheticSpec {
        shape: "qwen3.6-27b".parse().unwrap(),
        format: "q4_k_m".parse::<SyntheticFormat>().unwrap(),
        num_layers: Some(4),
        seed: 5,
    };
    spec.write_gguf(&path).unwrap();
    let model = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
    let cfg = model.config();
    let dn = cfg.delta_net.as_ref().expect("a hybrid");
    assert_eq!(dn.layers(), [0, 1, 2]);
    assert_eq!((dn.k_heads, dn.v_heads, dn.head_dim), (16, 48, 128));
    assert_eq!((cfg.head_dim, cfg.rotary_dims()), (256, 64));
    let mut kv = model.new_kv_cache(4, 16).unwrap();
    let mut batch = StepBatch::new(16);
    batch.groups = kv.step_groups();
    batch.push_sequence(&[5, 6, 7, 8, 9], 0, &[0], true);
    batch.push_group_state(kv.recurrent_group().unwrap(), 0);
    let logits = model.forward(&batch, &mut kv).unwrap();
    let logits = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(logits.len(), 248_320);
    assert!(logits.iter().all(|x| x.is_finite()));
}
