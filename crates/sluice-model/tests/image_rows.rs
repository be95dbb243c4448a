//! A step's image rows (`StepBatch::image_rows`): rows that read a vision tower's embeddings
//! in place of a token's, and that attend to the whole image (Gemma 3's bidirectional image
//! tokens). Checked bit for bit, as every row of `batch_invariance.rs`, on a tiny Gemma 3
//! (its local layers' window crosses the image) in F32 and Q4_K, on every kernel tier:
//! - the prompt's logits and the next token's are the same prefilled in one step, in chunks
//!   that end at the image's edges, beside another sequence's rows, and after a prefix of
//!   blocks that another sequence computed (a cache hit that ends inside the image);
//! - an image token sees the image's later tokens (its hidden state changes with them) and
//!   a text token before the image does not;
//! - the image's rows are the embeddings given: another image changes the logits.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use sluice_kernels::cpu::KernelTier;
use sluice_model::testing::TinyModelSpec;
use sluice_model::{Architecture, KvCache, LlamaModel, LoadOptions, StepBatch};

const BLOCK: usize = 16;
/// The prompt: 8 text tokens, a 20-token image (rows 8..28, crossing the block edge at 16),
/// then 9 text tokens.
const PROMPT: usize = 37;
const IMAGE: std::ops::Range<usize> = 8..28;

fn spec(dtype: GgmlDType) -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Gemma3,
        hidden_size: 256,
        intermediate_size: 512,
        num_heads: 4,
        num_kv_heads: 2,
        dtype,
        ..TinyModelSpec::default()
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) % 20_001) as f32 / 10_000.0 - 1.0
        })
        .collect()
}

fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    values(n, seed)
        .iter()
        .map(|v| ((v + 1.0) * 0.5 * (vocab - 1) as f32) as u32)
        .collect()
}

/// What one run gives: the logits after the prompt and after one more token, and the final
/// hidden states of the rows asked for in the step that computed them, as bits.
#[derive(Debug, PartialEq, Eq)]
struct Out {
    prompt: Vec<u32>,
    next: Vec<u32>,
    hidden: Vec<u32>,
}

struct Run<'a> {
    model: &'a LlamaModel,
    prompt: Vec<u32>,
    image: Arc<[f32]>,
    /// Whether the image's rows see the whole image (false: causal, as text).
    bidirectional: bool,
}

impl Run<'_> {
    /// Pushes prompt rows `from..to` of the sequence (table `table`) and marks the image's.
    fn push(&self, batch: &mut StepBatch, from: usize, to: usize, table: &[u32], hidden: &[usize]) {
        let row0 = batch.num_tokens();
        batch.push_sequence(&self.prompt[from..to], from, table, to == PROMPT);
        let (a, b) = (IMAGE.start.max(from), IMAGE.end.min(to));
        if a < b && self.bidirectional {
            batch.push_image_rows(
                &self.image,
                row0 + a - from,
                b - a,
                a - IMAGE.start,
                IMAGE.end,
            );
        } else if a < b {
            // The same embeddings, each row seeing only what a text row would.
            for p in a..b {
                batch.push_image_rows(&self.image, row0 + p - from, 1, p - IMAGE.start, p + 1);
            }
        }
        batch.hidden_indices.extend(
            hidden
                .iter()
                .filter(|&&p| (from..to).contains(&p))
                .map(|&p| (row0 + p - from) as u32),
        );
    }

    /// The prompt prefilled in steps ending at `cuts` (beside `filler` rows of another prompt
    /// in each step), then one more token. With `hit`, blocks 0 of the prompt come from
    /// another sequence that computed the whole prompt first, and the run starts at token 16.
    fn run(&self, cuts: &[usize], filler: usize, hit: bool, hidden: &[usize]) -> Out {
        let vocab = self.model.config().vocab_size;
        let mut kv: KvCache = self.model.new_kv_cache(16, BLOCK).unwrap();
        let mut batch = StepBatch::new(BLOCK);
        batch.groups = kv.step_groups();
        let mut start = 0;
        let table: Vec<u32> = if hit {
            let other = [0, 4, 5];
            batch.clear();
            self.push(&mut batch, 0, PROMPT, &other, &[]);
            self.model.forward(&batch, &mut kv).unwrap();
            start = BLOCK;
            vec![0, 1, 2]
        } else {
            vec![0, 1, 2]
        };
        let mut step =
            |batch: &mut StepBatch, from: usize, to: usize, next: Option<u32>, n: usize| {
                batch.clear();
                if n > 0 {
                    batch.push_sequence(&tokens(n, 77, vocab), 0, &[8, 9], true);
                }
                match next {
                    Some(t) => batch.push_sequence(&[t], PROMPT, &table, true),
                    None => self.push(batch, from, to, &table, hidden),
                }
                let (logits, states) = self.model.forward_step(batch, &mut kv).unwrap();
                let logits = logits.to_vec2::<f32>().unwrap();
                // The sequence's row is the step's last; a chunk that does not end the prompt
                // has none (a filler's, where there is one, is not wanted).
                let last = logits
                    .last()
                    .map(|row| row.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .unwrap_or_default();
                let states = states
                    .map(|s| s.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                    .unwrap_or_default();
                (
                    last,
                    states.into_iter().map(f32::to_bits).collect::<Vec<_>>(),
                )
            };
        let (mut prompt, mut hidden_bits) = (Vec::new(), Vec::new());
        let begin = start;
        for &cut in cuts.iter().filter(|&&c| c > begin) {
            let (logits, h) = step(&mut batch, start, cut, None, filler);
            hidden_bits.extend(h);
            prompt = logits;
            start = cut;
        }
        let (next, _) = step(&mut batch, 0, 0, Some(tokens(1, 5, vocab)[0]), filler);
        Out {
            prompt,
            next,
            hidden: hidden_bits,
        }
    }
}

fn check(model: &LlamaModel, what: &str) -> Out {
    let config = model.config();
    let (vocab, hidden) = (config.vocab_size, config.hidden_size);
    let image: Arc<[f32]> = values(IMAGE.len() * hidden, 3).into();
    let mut prompt = tokens(PROMPT, 1, vocab);
    // An image's rows hold cache keys, not tokens: not looked up, so any id, even past the
    // vocabulary, is fine there.
    for p in IMAGE {
        prompt[p] = 0x8000_0000 | p as u32;
    }
    let run = Run {
        model,
        prompt: prompt.clone(),
        image: image.clone(),
        bidirectional: true,
    };
    let alone = run.run(&[PROMPT], 0, false, &[]);
    for (cuts, filler) in [
        (&[8, 28, 37][..], 0),
        (&[28, 37], 0),
        (&[8, 37], 13),
        (&[8, 28, 30, 37], 5),
    ] {
        assert_eq!(
            run.run(cuts, filler, false, &[]),
            alone,
            "{what}: cut at {cuts:?} beside {filler} rows"
        );
    }
    assert_eq!(
        run.run(&[PROMPT], 0, true, &[]),
        alone,
        "{what}: after a cached prefix that ends inside the image"
    );

    // Rows 7 (text before the image) and 8 (the image's first) with the image's last token
    // changed: only the image's row sees it.
    let mut other = values(IMAGE.len() * hidden, 3);
    other[(IMAGE.len() - 1) * hidden..].copy_from_slice(&values(hidden, 9));
    let other: Arc<[f32]> = other.into();
    let h = |image: &Arc<[f32]>, bidirectional: bool| {
        let run = Run {
            model,
            prompt: prompt.clone(),
            image: image.clone(),
            bidirectional,
        };
        run.run(&[PROMPT], 0, false, &[7, 8])
    };
    let (a, b) = (h(&image, true), h(&other, true));
    assert_eq!(
        a.hidden[..hidden],
        b.hidden[..hidden],
        "{what}: a text row before the image saw it"
    );
    assert_ne!(
        a.hidden[hidden..],
        b.hidden[hidden..],
        "{what}: an image's first row did not see its last"
    );
    let causal = h(&other, false);
    assert_ne!(
        causal.hidden[hidden..],
        b.hidden[hidden..],
        "{what}: image rows attended causally"
    );
    assert_eq!(
        h(&image, false).hidden[hidden..],
        h(&other, false).hidden[hidden..],
        "{what}: a causal row saw a later one"
    );
    assert_ne!(
        a.prompt, b.prompt,
        "{what}: another image left the logits as they were"
    );
    alone
}

#[test]
fn image_rows_are_bidirectional_and_invisible_to_batching() {
    let dir = std::env::temp_dir().join(format!("sluice-image-rows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tiers = KernelTier::available();
    for dtype in [GgmlDType::F32, GgmlDType::Q4K] {
        let path = dir.join(format!("{dtype:?}.gguf"));
        spec(dtype).write_gguf(&path).unwrap();
        let mut first: Option<(KernelTier, Out)> = None;
        for &tier in &tiers {
            sluice_kernels::cpu::limit_kernels(tier);
            let model = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
            let what = format!("gemma3 {dtype:?} on {tier:?} kernels");
            let got = check(&model, &what);
            match &first {
                None => first = Some((tier, got)),
                Some((t0, want)) => assert!(*want == got, "{what}: differs from {t0:?} kernels'"),
            }
        }
        sluice_kernels::cpu::limit_kernels(*tiers.last().expect("one tier at least"));
    }
    std::fs::remove_dir_all(&dir).ok();
}
