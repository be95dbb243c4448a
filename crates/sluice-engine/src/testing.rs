//! Test doubles for the engine: a weightless [`Model`] and a small real tokenizer, so the
//! engine loop, its events and its failure handling are tested (and benchmarked) in
//! milliseconds.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use sluice_model::sampling::sample_row;
use sluice_model::{StepBatch, StepOutput};
use sluice_tokenizer::{MetadataMap, MetadataValue, Tokenizer};

use crate::images::ImageLimits;
use crate::model::{Model, ModelFailure};

fn mix(h: u64, x: u64) -> u64 {
    let mut z = h ^ x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// The mock's hidden size: the length of its embeddings.
pub const MOCK_HIDDEN_SIZE: usize = 8;

/// A model without weights whose logits are a deterministic function of a sequence's whole
/// context, read back through its block table: like a real model, a wrong block table, a
/// wrong position or a bad prefix-cache hit changes what it predicts.
///
/// Its "KV cache" holds, per slot, a hash chaining the token written there with everything
/// before it. A sampling row's logits are a fixed random row rotated by the hash of the
/// context, plus a bump on one token the hash picks, so greedy decoding follows the hash and
/// sampling sees a realistic spread of logits.
pub struct MockModel {
    vocab_size: usize,
    max_model_len: usize,
    block_size: usize,
    kv: Vec<Option<u64>>,
    base: Vec<f32>,
    control: MockControl,
    /// Samples the rows the engine marks ([`Model::samples_rows`]), as a GPU model does.
    samples_rows: bool,
    /// Takes images of this shape ([`MockModel::taking_images`]).
    images: Option<ImageLimits>,
    /// Images encoded, ever, and the calls that encoded them.
    encoded: Arc<(AtomicUsize, AtomicUsize)>,
}

impl MockModel {
    pub fn new(
        vocab_size: usize,
        max_model_len: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> Self {
        let mut s = SEED;
        let base = (0..vocab_size)
            .map(|_| {
                s = mix(s, 1);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
            })
            .collect();
        Self {
            vocab_size,
            max_model_len,
            block_size,
            kv: vec![None; num_blocks * block_size],
            base,
            control: MockControl::default(),
            samples_rows: false,
            images: None,
            encoded: Arc::default(),
        }
    }

    /// This model takes images of `limits`' shape: its "tower" gives each image token a row
    /// that is a hash of the image's pixels and the token's place, and an image token's slot
    /// chains that row's hash where a text token's chains its id, so the image reaches what
    /// it predicts.
    pub fn taking_images(mut self, limits: ImageLimits) -> Self {
        self.images = Some(limits);
        self
    }

    /// (images encoded, calls that encoded them) so far, readable while the engine owns the
    /// model.
    pub fn encoded(&self) -> Arc<(AtomicUsize, AtomicUsize)> {
        self.encoded.clone()
    }

    /// This model samples the rows the engine lets it ([`Model::samples_rows`]), by the rule
    /// a GPU model's kernel follows, instead of handing their logits back.
    pub fn sampling_rows_itself(mut self) -> Self {
        self.samples_rows = true;
        self
    }

    /// A handle to steer this model from a test while the engine owns it.
    pub fn control(&self) -> MockControl {
        self.control.clone()
    }

    fn slot(&self, batch: &StepBatch, table: &[u32], pos: usize) -> Result<usize, ModelFailure> {
        let block = table
            .get(pos / self.block_size)
            .ok_or_else(|| ModelFailure::new(format!("position {pos} is past the block table")))?;
        let slot = *block as usize * batch.block_size + pos % self.block_size;
        if slot >= self.kv.len() {
            return Err(ModelFailure::new(format!(
                "slot {slot} is outside the cache"
            )));
        }
        Ok(slot)
    }
}

/// Row `row`'s image row (`width` values) where it is an image's token, from the step's image
/// runs.
fn image_row(batch: &StepBatch, row: usize, width: usize) -> Result<Option<&[f32]>, ModelFailure> {
    let Some(run) = batch
        .image_rows
        .iter()
        .find(|r| (r.row as usize..(r.row + r.len) as usize).contains(&row))
    else {
        return Ok(None);
    };
    let token = run.first as usize + row - run.row as usize;
    batch
        .images
        .get(run.image as usize)
        .and_then(|image| image.get(token * width..(token + 1) * width))
        .map(Some)
        .ok_or_else(|| ModelFailure::new(format!("image rows {run:?} past the step's images")))
}

impl Model for MockModel {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.kv.len() / self.block_size
    }

    fn hidden_size(&self) -> usize {
        MOCK_HIDDEN_SIZE
    }

    fn samples_rows(&self) -> bool {
        self.samples_rows
    }

    fn image_input(&self) -> Option<ImageLimits> {
        self.images
    }

    fn encode_images(&mut self, images: &[&[f32]], out: &mut Vec<f32>) -> Result<(), ModelFailure> {
        let Some(limits) = self.images else {
            return Err(ModelFailure::new("this mock takes no images"));
        };
        out.clear();
        for pixels in images {
            if pixels.len() != limits.pixels_per_image {
                return Err(ModelFailure::new(format!(
                    "an image of {} pixel values; this mock takes {}",
                    pixels.len(),
                    limits.pixels_per_image
                )));
            }
            let h = pixels
                .iter()
                .fold(SEED, |h, p| mix(h, u64::from(p.to_bits())));
            for token in 0..limits.tokens_per_image as u64 {
                let row = mix(h, token);
                out.extend((0..MOCK_HIDDEN_SIZE as u64).map(|j| (mix(row, j) >> 40) as f32));
            }
        }
        self.encoded.0.fetch_add(images.len(), Ordering::SeqCst);
        self.encoded.1.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn forward(&mut self, batch: &StepBatch, out: &mut StepOutput) -> Result<(), ModelFailure> {
        self.control.before_forward()?;
        let logits = &mut out.logits;
        logits.clear();
        out.hidden.clear();
        // A row's hidden state is a function of its position's context hash (what its slot
        // holds once written), so it does not depend on the rest of the batch.
        let mut hidden_rows = batch.hidden_indices.iter().peekable();
        // Sampling rows come in batch order: a sequence's last token, or its last few when it
        // verifies drafts.
        let mut rows = batch.logits_indices.iter().peekable();
        for s in &batch.sequences {
            let table = batch.block_table(s);
            let start = s.context_len - s.query_len;
            let mut h = if start == 0 {
                SEED
            } else {
                let slot = self.slot(batch, table, start - 1)?;
                self.kv[slot].ok_or_else(|| {
                    ModelFailure::new(format!(
                        "read of unwritten slot {slot} at position {}",
                        start - 1
                    ))
                })?
            };
            for (i, &token) in batch.input_ids[s.query_start..s.query_start + s.query_len]
                .iter()
                .enumerate()
            {
                let row = s.query_start + i;
                h = match image_row(batch, row, MOCK_HIDDEN_SIZE)? {
                    // An image's token chains its row (all of it), not the cache key there.
                    Some(values) => values.iter().fold(h, |h, v| mix(h, u64::from(v.to_bits()))),
                    None => mix(h, u64::from(token)),
                };
                let slot = self.slot(batch, table, start + i)?;
                self.kv[slot] = Some(h);
                let row = (s.query_start + i) as u32;
                if hidden_rows.peek() == Some(&&row) {
                    hidden_rows.next();
                    out.hidden.extend(
                        (0..MOCK_HIDDEN_SIZE as u64)
                            .map(|j| ((mix(h, j) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0),
                    );
                }
                if rows.peek() == Some(&&row) {
                    rows.next();
                    self.push_logits(batch, table, start + i + 1, logits)?;
                }
            }
        }
        if let Some(row) = rows.next() {
            return Err(ModelFailure::new(format!(
                "logits row {row} is out of order or past the batch"
            )));
        }
        if let Some(row) = hidden_rows.next() {
            return Err(ModelFailure::new(format!(
                "hidden-state row {row} is out of order or past the batch"
            )));
        }
        self.sample_marked_rows(batch, out)?;
        self.control.after_forward();
        Ok(())
    }
}

impl MockModel {
    /// The logits after the first `context_len` tokens of a sequence, read back through its
    /// block table: a function of every slot's content, so of the whole context.
    fn push_logits(
        &self,
        batch: &StepBatch,
        table: &[u32],
        context_len: usize,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelFailure> {
        let mut fold = SEED;
        for pos in 0..context_len {
            let slot = self.slot(batch, table, pos)?;
            let v = self.kv[slot]
                .ok_or_else(|| ModelFailure::new(format!("read of unwritten slot {slot}")))?;
            fold = mix(fold, v);
        }
        let shift = (fold % self.vocab_size as u64) as usize;
        let row_start = logits.len();
        logits.extend_from_slice(&self.base[shift..]);
        logits.extend_from_slice(&self.base[..shift]);
        let peak = (mix(fold, 7) % self.vocab_size as u64) as usize;
        logits[row_start + peak] += 6.0;
        Ok(())
    }

    /// Replaces the logits of the rows the engine marked with their sampled tokens, keeping
    /// the other rows' logits in order.
    fn sample_marked_rows(
        &self,
        batch: &StepBatch,
        out: &mut StepOutput,
    ) -> Result<(), ModelFailure> {
        out.sampled.clear();
        if batch.model_sampling.is_empty() {
            return Ok(());
        }
        if !self.samples_rows || batch.model_sampling.len() != batch.logits_indices.len() {
            return Err(ModelFailure::new(
                "rows marked for a model that does not sample them, or not one mark per row",
            ));
        }
        let v = self.vocab_size;
        let mut kept = 0;
        for (i, rule) in batch.model_sampling.iter().enumerate() {
            match rule {
                Some(rule) => out
                    .sampled
                    .push(sample_row(&out.logits[i * v..][..v], rule)),
                None => {
                    out.logits.copy_within(i * v..(i + 1) * v, kept * v);
                    kept += 1;
                }
            }
        }
        out.logits.truncate(kept * v);
        self.control
            .state
            .model_sampled
            .fetch_add(out.sampled.len() as u64, Ordering::SeqCst);
        Ok(())
    }
}

const GATE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Gate {
    /// While set, each forward waits for a permit.
    held: bool,
    permits: usize,
    /// Forwards that have reached the gate while it held, ever.
    arrivals: u64,
}

#[derive(Default)]
struct ControlState {
    gate: Mutex<Gate>,
    changed: Condvar,
    fail_next: AtomicUsize,
    forwards: AtomicU64,
    model_sampled: AtomicU64,
}

/// Steers a [`MockModel`] from a test: fail forwards, or hold them at a gate to freeze the
/// engine mid-step at a known point.
#[derive(Clone, Default)]
pub struct MockControl {
    state: Arc<ControlState>,
}

impl MockControl {
    /// The next `n` forwards fail.
    pub fn fail_next(&self, n: usize) {
        self.state.fail_next.store(n, Ordering::SeqCst);
    }

    /// From now on every forward waits for a [`MockControl::release`] permit.
    pub fn hold(&self) {
        self.state.gate.lock().unwrap().held = true;
    }

    /// Lets `n` held forwards through.
    pub fn release(&self, n: usize) {
        self.state.gate.lock().unwrap().permits += n;
        self.state.changed.notify_all();
    }

    /// Stops holding forwards; those waiting go through.
    pub fn open(&self) {
        self.state.gate.lock().unwrap().held = false;
        self.state.changed.notify_all();
    }

    /// Waits until the `k`-th held forward (counting from 1 since the model was made) has
    /// reached the gate; false if it did not within `timeout`.
    pub fn wait_until_held(&self, k: u64, timeout: Duration) -> bool {
        let gate = self.state.gate.lock().unwrap();
        let (gate, _) = self
            .state
            .changed
            .wait_timeout_while(gate, timeout, |g| g.arrivals < k)
            .unwrap();
        gate.arrivals >= k
    }

    /// Forwards that completed successfully.
    pub fn forwards(&self) -> u64 {
        self.state.forwards.load(Ordering::SeqCst)
    }

    /// Rows the model sampled itself, ever.
    pub fn model_sampled_rows(&self) -> u64 {
        self.state.model_sampled.load(Ordering::SeqCst)
    }

    fn before_forward(&self) -> Result<(), ModelFailure> {
        let mut gate = self.state.gate.lock().unwrap();
        if gate.held {
            gate.arrivals += 1;
            self.state.changed.notify_all();
            // Bounded, so a test that fails while holding the gate cannot hang the engine
            // thread (and with it the test's teardown) forever.
            gate = self
                .state
                .changed
                .wait_timeout_while(gate, GATE_TIMEOUT, |g| g.held && g.permits == 0)
                .unwrap()
                .0;
            if gate.held && gate.permits > 0 {
                gate.permits -= 1;
            }
        }
        drop(gate);
        let fail = self
            .state
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(ModelFailure::new("injected failure"));
        }
        Ok(())
    }

    fn after_forward(&self) {
        self.state.forwards.fetch_add(1, Ordering::SeqCst);
    }
}

/// An endless xorshift64 stream from `seed` (any seed, 0 included): reproducible test data
/// without a dependency.
pub fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

/// `len` pseudo-random byte tokens from `seed` ([`xorshift`]): prompts of the
/// [`tiny_tokenizer`] that never hold a control token.
pub fn byte_prompt(seed: u64, len: usize) -> Vec<u32> {
    xorshift(seed).take(len).map(|x| (x % 256) as u32).collect()
}

/// GPT-2's byte-level alphabet: the character that stands for each byte in a vocabulary.
fn byte_char(byte: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(byte) {
        return char::from(byte);
    }
    // Bytes without a printable character map, in order, to U+0100 onwards.
    let rank = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// Ids of [`tiny_tokenizer`]'s control tokens.
pub const TINY_ENDOFTEXT: u32 = 259;
pub const TINY_IM_START: u32 = 260;
pub const TINY_IM_END: u32 = 261;
/// Vocabulary size of [`tiny_tokenizer`].
pub const TINY_VOCAB: usize = 262;

/// A small real tokenizer: one token per byte with id = byte value, merges building "Ġt",
/// "he" and "Ġthe" (256..259), then `<|endoftext|>` (259, BOS and EOS), `<|im_start|>` and
/// `<|im_end|>` as control tokens; its EOS ids are 259 and 261. Built once per process, in
/// memory.
pub fn tiny_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
            tokens.extend(["Ġt", "he", "Ġthe"].map(String::from));
            tokens.extend(["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from));
            let mut types = vec![1i32; 259];
            types.extend([3, 3, 3]);
            let merges = ["Ġ t", "h e", "Ġt he"];
            let mut metadata = MetadataMap::new();
            let text = |s: &str| MetadataValue::String(s.into());
            metadata.insert("tokenizer.ggml.model", text("gpt2"));
            metadata.insert("tokenizer.ggml.pre", text("gpt-2"));
            metadata.insert("tokenizer.ggml.tokens", MetadataValue::strings(tokens));
            metadata.insert("tokenizer.ggml.token_type", MetadataValue::ints(types));
            metadata.insert("tokenizer.ggml.merges", MetadataValue::strings(merges));
            let endoftext = MetadataValue::Int(TINY_ENDOFTEXT.into());
            metadata.insert("tokenizer.ggml.bos_token_id", endoftext.clone());
            metadata.insert("tokenizer.ggml.eos_token_id", endoftext);
            metadata.insert("tokenizer.ggml.add_bos_token", MetadataValue::Bool(false));
            let tok = Tokenizer::from_gguf(&metadata, Path::new("tiny-tokenizer.gguf"))
                .unwrap_or_else(|e| panic!("the tiny tokenizer is malformed: {e}"));
            Arc::new(tok)
        })
        .clone()
}
