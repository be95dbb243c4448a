//! Where integration tests find the real model and the reference fixtures. Missing files fail
//! the test with the command that fetches them: a silently skipped test proves nothing. The
//! optional models (`sluice_model::testing::optional_model`) are the exception, as not every machine can hold a
//! gigabyte download; their tests say that they skipped, and CI fetches them.

// Each test crate includes this module and uses only some of it.
#![allow(dead_code)]

pub mod decode;
pub mod fidelity;
pub mod python;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use sluice_model::{LlamaModel, LoadOptions, ModelSource, StepBatch, WeightsKind};
use sluice_tokenizer::Tokenizer;

/// The model at `path` as `kind` holds it, loaded into `cell` once for every test of a binary
/// (a real model's load takes seconds, and its f32 copy gigabytes).
pub fn load_once(
    cell: &'static OnceLock<LlamaModel>,
    path: &Path,
    kind: WeightsKind,
) -> &'static LlamaModel {
    cell.get_or_init(|| {
        let started = Instant::now();
        let options = LoadOptions {
            weights: kind,
            ..LoadOptions::default()
        };
        let model = LlamaModel::load(path, &options).unwrap();
        eprintln!("{kind} weights loaded in {:.1?}", started.elapsed());
        model
    })
}

/// The tokenizer of the model at `path`, read into `cell` once.
pub fn tokenizer_once(cell: &'static OnceLock<Tokenizer>, path: &Path) -> &'static Tokenizer {
    cell.get_or_init(|| ModelSource::open(path).unwrap().tokenizer().unwrap())
}

/// The SmolLM2-135M-Instruct GGUF: `$SLUICE_MODEL`, else `models/` at the workspace root.
pub fn model_path() -> PathBuf {
    let path = match std::env::var_os("SLUICE_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(
        path.is_file(),
        "model not found at {}: run scripts/fetch-model.sh (or set SLUICE_MODEL)",
        path.display()
    );
    path
}

/// The llama.cpp reference fixtures: `$SLUICE_FIXTURES`, else `tests/fixtures` in the
/// workspace.
pub fn fixtures_dir() -> PathBuf {
    let dir = match std::env::var_os("SLUICE_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"),
    };
    assert!(
        dir.is_dir(),
        "fixtures not found at {} (set SLUICE_FIXTURES to the directory holding \
         smollm2-*.jsonl)",
        dir.display()
    );
    dir
}

/// Every row of a JSON-lines fixture file, e.g. `read_jsonl("smollm2-greedy.jsonl")`.
pub fn read_jsonl(name: &str) -> Vec<serde_json::Value> {
    let path = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let rows: Vec<serde_json::Value> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect();
    assert!(!rows.is_empty(), "{} has no rows", path.display());
    rows
}

/// A JSON array of token ids as `Vec<u32>`.
pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected an array of ids, got {value}"))
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .unwrap_or_else(|| panic!("not a token id: {v}"))
        })
        .collect()
}

/// The bits of every position's logits of `tokens`, computed by one prefill step over a cache
/// of 16-token blocks.
pub fn prefill_logit_bits(model: &LlamaModel, tokens: &[u32]) -> Vec<Vec<u32>> {
    const BLOCK: usize = 16;
    let blocks = tokens.len().div_ceil(BLOCK);
    let mut kv = model.new_kv_cache(blocks, BLOCK).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = StepBatch::new(BLOCK);
    batch.groups = kv.step_groups();
    batch.push_sequence(tokens, 0, &table, true);
    push_state(&kv, &mut batch, 0);
    batch.logits_indices = (0..tokens.len() as u32).collect();
    model
        .forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
        .into_iter()
        .map(|r| r.into_iter().map(f32::to_bits).collect())
        .collect()
}

/// For a hybrid's cache (`LlamaModel::new_kv_cache`: a state a block), the last pushed
/// sequence's recurrent state: `state`, which the caller keeps for that sequence. Nothing for
/// a model without recurrent layers.
pub fn push_state(kv: &sluice_model::KvCache, batch: &mut StepBatch, state: u32) {
    if let Some(g) = kv.recurrent_group() {
        batch.push_group_state(g, state);
    }
}
