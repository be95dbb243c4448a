//! Greedy decoding of many sequences over one paged KV cache, one batched forward per step, as
//! the engine runs them; a sequence alone is the batch of one.

use sluice_model::{LlamaModel, StepBatch};

pub const BLOCK: usize = 16;

/// The id of the largest logit, the lowest id among equals so that ties cannot make two runs
/// differ.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// One sequence to decode: its prompt, and the step (from 0) at which it joins, so that
/// prefills of late joiners share a step with other sequences' decode tokens.
pub struct Request<'a> {
    pub prompt: &'a [u32],
    pub join_at: usize,
}

/// Greedy continuations of every request, decoded together. Each step holds the prefill of
/// the requests that join at it and one decode token of every running sequence; a sequence
/// leaves at an `eos` id (not kept) or after `max_new` tokens. Blocks are handed out from the
/// back of the cache in the order sequences join, so block tables are neither contiguous nor
/// in sequence order.
pub fn greedy_together(
    model: &LlamaModel,
    requests: &[Request],
    max_new: usize,
    eos: &[u32],
) -> Vec<Vec<u32>> {
    assert!(max_new > 0);
    let blocks_of = |r: &Request| (r.prompt.len() + max_new).div_ceil(BLOCK);
    let total: usize = requests.iter().map(blocks_of).sum();
    let mut kv = model.new_kv_cache(total, BLOCK).unwrap();
    let mut next_free = total as u32;
    let mut tables: Vec<Option<Vec<u32>>> = vec![None; requests.len()];
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
    let mut done = vec![false; requests.len()];
    let mut batch = StepBatch::new(BLOCK);
    batch.groups = kv.step_groups();
    let mut step = 0;
    while done.contains(&false) {
        batch.clear();
        // The request each logits row belongs to, in the order rows come back.
        let mut rows = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if done[i] || r.join_at > step {
                continue;
            }
            match &tables[i] {
                None => {
                    let table: Vec<u32> = (0..blocks_of(r))
                        .map(|_| {
                            next_free -= 1;
                            next_free
                        })
                        .collect();
                    batch.push_sequence(r.prompt, 0, &table, true);
                    super::push_state(&kv, &mut batch, i as u32);
                    tables[i] = Some(table);
                }
                Some(table) => {
                    let last = *outs[i].last().expect("a running sequence has a token");
                    let pos = r.prompt.len() + outs[i].len() - 1;
                    batch.push_sequence(&[last], pos, table, true);
                    super::push_state(&kv, &mut batch, i as u32);
                }
            }
            rows.push(i);
        }
        if !rows.is_empty() {
            let logits = model
                .forward(&batch, &mut kv)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            assert_eq!(logits.len(), rows.len());
            for (row, &i) in logits.iter().zip(&rows) {
                let next = argmax(row);
                if eos.contains(&next) {
                    done[i] = true;
                } else {
                    outs[i].push(next);
                    done[i] = outs[i].len() == max_new;
                }
            }
        }
        step += 1;
    }
    outs
}

/// The greedy continuation of one sequence, alone in every step.
pub fn greedy_alone(model: &LlamaModel, prompt: &[u32], max_new: usize, eos: &[u32]) -> Vec<u32> {
    greedy_together(model, &[Request { prompt, join_at: 0 }], max_new, eos)
        .pop()
        .unwrap()
}

/// Decodes `prompts` one at a time, then together (a quarter joining at each of the first
/// four steps, so prefills share steps with decode tokens), and asserts that each sequence
/// got exactly the same greedy tokens both ways (`describe` renders tokens for the message).
/// Returns the tokens, and how long alone and together took.
pub fn assert_batching_changes_no_token(
    model: &LlamaModel,
    prompts: &[Vec<u32>],
    max_new: usize,
    eos: &[u32],
    describe: impl Fn(&[u32]) -> String,
) -> (Vec<Vec<u32>>, std::time::Duration, std::time::Duration) {
    let started = std::time::Instant::now();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| greedy_alone(model, p, max_new, eos))
        .collect();
    let alone_time = started.elapsed();
    let started = std::time::Instant::now();
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p,
            join_at: i % 4,
        })
        .collect();
    let together = greedy_together(model, &requests, max_new, eos);
    let together_time = started.elapsed();
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            a,
            t,
            "sequence {i} ({:?}): alone {:?}, batched {:?}",
            describe(&prompts[i]),
            describe(a),
            describe(t)
        );
    }
    (alone, alone_time, together_time)
}
