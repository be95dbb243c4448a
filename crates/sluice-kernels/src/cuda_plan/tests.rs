//! The plan checked without a GPU: an emulation of the kernels' index arithmetic that reads only
//! the plan's metadata buffer (what the device reads) must give what the CPU attention kernel
//! gives, on mixed steps, with and without split-K; the constants must match the `.cu` files;
//! and a step's launches must not grow with its sequences.

use super::*;
use crate::cpu::attention;
use crate::paged::KvLayout;

/// `#define NAME value` of a CUDA source.
fn define(source: &str, name: &str) -> usize {
    source
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("#define ")?.strip_prefix(name)?;
            rest.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no #define {name}"))
}

#[test]
fn constants_match_the_cuda_sources() {
    let attn = include_str!("../../cuda/paged_attention.cu");
    assert_eq!(define(attn, "ATTN_THREADS"), ATTN_THREADS as usize);
    assert_eq!(define(attn, "ATTN_ROWS"), ATTN_ROWS);
    assert_eq!(define(attn, "ATTN_KEYS"), ATTN_KEYS);
    assert_eq!(define(attn, "COMBINE_THREADS"), COMBINE_THREADS as usize);
    let fused = include_str!("../../cuda/fused.cu");
    assert_eq!(define(fused, "NORM_THREADS"), NORM_THREADS as usize);
    assert_eq!(define(fused, "ROPE_THREADS"), ROPE_THREADS as usize);
    assert_eq!(define(fused, "SWIGLU_THREADS"), SWIGLU_THREADS as usize);
    let sampling = include_str!("../../cuda/sampling.cu");
    assert_eq!(define(sampling, "SAMPLE_THREADS"), SAMPLE_THREADS as usize);
    assert_eq!(define(sampling, "SAMPLE_PARAM_WORDS"), SAMPLE_PARAM_WORDS);
    assert_eq!(define(sampling, "SAMPLE_OUT_WORDS"), SAMPLE_OUT_WORDS);
    assert_eq!(
        define(sampling, "THRESHOLD_STEPS"),
        crate::sampling::THRESHOLD_STEPS
    );
    assert_eq!(
        define(sampling, "MAX_TOP_LOGPROBS"),
        crate::sampling::MAX_TOP_LOGPROBS
    );
}

/// A small deterministic generator (xorshift): the crate has no `rand`.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A step: each sequence `(cached, new)` tokens, blocks drawn at random from the pool.
struct Step {
    sequences: Vec<SequenceSlice>,
    block_tables: Vec<u32>,
    num_tokens: usize,
}

fn step(rng: &mut Rng, seqs: &[(usize, usize)], block_size: usize, num_blocks: usize) -> Step {
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    let (mut sequences, mut block_tables, mut t) = (Vec::new(), Vec::new(), 0);
    for &(cached, new) in seqs {
        let context = cached + new;
        let n_blocks = context.div_ceil(block_size);
        let start = block_tables.len();
        for _ in 0..n_blocks {
            block_tables.push(free.swap_remove(rng.below(free.len())));
        }
        sequences.push(SequenceSlice {
            query_start: t,
            query_len: new,
            context_len: context,
            block_table_start: start,
            block_table_len: n_blocks,
        });
        t += new;
    }
    Step {
        sequences,
        block_tables,
        num_tokens: t,
    }
}

/// What the device computes, from `plan.metadata` alone: the attention kernel's tiles,
/// partitions, chunks and online softmax in log2 units, then the partitions merged in order
/// (by the unsplit kernel as it goes, or by the combine after the split kernel: one rule).
fn emulate(plan: &AttentionPlan, q: &[f32], k: &[f32], v: &[f32], layout: &KvLayout) -> Vec<f32> {
    let md = &plan.metadata;
    let o = plan.offsets;
    let (h, d, bs) = (plan.num_heads, plan.head_dim, plan.block_size);
    let group = h / plan.num_kv_heads;
    // Each row's partition states, by partition.
    type State = (f32, f32, Vec<f32>);
    let mut partials: Vec<Vec<Option<State>>> = vec![Vec::new(); plan.num_tokens * h];
    let (gx, gy, gz) = plan.attention.grid;
    for (tile, kv_head, split) in (0..gx as usize)
        .flat_map(|x| (0..gy as usize).flat_map(move |y| (0..gz as usize).map(move |z| (x, y, z))))
    {
        let t = &md[o.tiles + 4 * tile..][..4];
        let (seq, first, queries, splits) =
            (t[0] as usize, t[1] as usize, t[2] as usize, t[3] as usize);
        // Block z of a split step walks partitions z, z + grid_splits, ...; otherwise the
        // block walks them all.
        let walked: Vec<usize> = match plan.split {
            Some(sk) => (split..splits).step_by(sk.grid_splits).collect(),
            None => (0..splits).collect(),
        };
        let s = &md[o.seqs + 4 * seq..][..4];
        let (query_start, query_len, context_len) = (s[0] as usize, s[1] as usize, s[2] as usize);
        let table = &md[o.block_tables + s[3] as usize..];
        let first_pos = context_len - query_len + first;
        let tile_keys = first_pos + queries;
        let partition = partition_keys(tile_keys, splits);
        for part in walked {
            let (key_begin, key_end) = (part * partition, tile_keys.min((part + 1) * partition));
            for row in 0..queries * group {
                let token = query_start + first + row / group;
                let head = kv_head * group + row % group;
                let last_key = first_pos + row / group;
                let qrow: Vec<f32> = q[(token * h + head) * d..][..d]
                    .iter()
                    .map(|x| x * plan.scale_log2)
                    .collect();
                let (mut m, mut l, mut acc) = (f32::NEG_INFINITY, 0f32, vec![0f32; d]);
                for chunk in (key_begin..key_end).step_by(ATTN_KEYS) {
                    let keys: Vec<usize> = (chunk..(chunk + ATTN_KEYS).min(key_end))
                        .filter(|&j| j <= last_key)
                        .collect();
                    let run = |j: usize| layout.block_head_offset(table[j / bs] as usize, kv_head);
                    let scores: Vec<f32> = keys
                        .iter()
                        .map(|&j| (0..d).map(|i| qrow[i] * k[run(j) + i * bs + j % bs]).sum())
                        .collect();
                    let m_new = scores.iter().fold(m, |a, &b| a.max(b));
                    let alpha = if m == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (m - m_new).exp2()
                    };
                    l *= alpha;
                    acc.iter_mut().for_each(|a| *a *= alpha);
                    for (&j, &sc) in keys.iter().zip(&scores) {
                        let p = (sc - m_new).exp2();
                        l += p;
                        for (i, a) in acc.iter_mut().enumerate() {
                            *a += p * v[run(j) + (j % bs) * d + i];
                        }
                    }
                    m = m_new;
                }
                let states = &mut partials[token * h + head];
                states.resize(splits, None);
                assert!(states[part].is_none(), "partition {part} walked twice");
                states[part] = Some((m, l, acc));
            }
        }
    }
    let mut out = vec![0f32; plan.num_tokens * h * d];
    for (row, states) in partials.iter().enumerate() {
        if plan.split.is_some() {
            assert_eq!(states.len(), md[o.token_splits + row / h] as usize);
        }
        let states = states
            .iter()
            .map(|s| s.as_ref().expect("every partition walked"));
        // merge_partition, in order.
        let (mut big_m, mut big_l, mut big_o) = (f32::NEG_INFINITY, 0f32, vec![0f32; d]);
        for (m, l, acc) in states {
            if *m == f32::NEG_INFINITY {
                continue;
            }
            if big_m == f32::NEG_INFINITY {
                (big_m, big_l, big_o) = (*m, *l, acc.clone());
                continue;
            }
            let merged = big_m.max(*m);
            let (a, b) = ((big_m - merged).exp2(), (m - merged).exp2());
            big_l = big_l * a + l * b;
            for (x, y) in big_o.iter_mut().zip(acc) {
                *x = *x * a + y * b;
            }
            big_m = merged;
        }
        let inv = if big_l > 0.0 { 1.0 / big_l } else { 0.0 };
        for (i, x) in big_o.iter().enumerate() {
            out[row * d + i] = x * inv;
        }
    }
    out
}

/// Plans `seqs`, emulates the device and compares with the CPU kernel.
fn check(
    seed: u64,
    seqs: &[(usize, usize)],
    heads: (usize, usize),
    d: usize,
    bs: usize,
    device: DeviceLimits,
) -> AttentionPlan {
    let mut rng = Rng(seed);
    let context: usize = seqs.iter().map(|s| (s.0 + s.1).div_ceil(bs)).sum();
    let layout = KvLayout {
        num_blocks: context + 3,
        block_size: bs,
        num_kv_heads: heads.1,
        head_dim: d,
    };
    let step = step(&mut rng, seqs, bs, layout.num_blocks);
    let shape = AttentionShape {
        num_heads: heads.0,
        num_kv_heads: heads.1,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        window: None,
    };
    let plan = AttentionPlan::new(
        &step.sequences,
        &step.block_tables,
        step.num_tokens,
        &shape,
        bs,
        device,
    )
    .unwrap();
    let n = layout.values_per_layer();
    let k: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    let v: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    let q: Vec<f32> = (0..step.num_tokens * heads.0 * d)
        .map(|_| 2.0 * rng.unit())
        .collect();
    let mut want = vec![0f32; q.len()];
    attention::paged_attention(
        &q,
        &k,
        &v,
        &layout,
        &step.sequences,
        &[],
        &step.block_tables,
        &shape,
        None,
        &mut want,
    )
    .unwrap();
    let got = emulate(&plan, &q, &k, &v, &layout);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "seed {seed} {seqs:?}: element {i}: {g} vs {w}"
        );
    }
    plan
}

#[test]
fn mixed_steps_match_the_cpu_kernel() {
    // Decode tokens, a first prefill chunk and a later one, in one step; GQA groups of 1, 2, 6
    // (Qwen2.5-1.5B: 12 over 2) and 8; both head dims; blocks of 16 and of 8.
    let mixed = [(37, 1), (0, 23), (40, 9), (0, 1), (15, 1)];
    for (seed, heads, d, bs) in [
        (1, (4, 4), 64, 16),
        (2, (4, 2), 128, 16),
        (3, (12, 2), 128, 16),
        (4, (16, 2), 64, 8),
        (5, (9, 9), 64, 32),
    ] {
        // The 38-key row takes two partitions: walked by blocks apart and merged by the
        // combine, or (no room for a workspace) by one block.
        let plan = check(seed, &mixed, heads, d, bs, DeviceLimits::HOPPER);
        assert!(plan.split.is_some());
        let plan = check(seed, &mixed, heads, d, bs, WALK);
        assert!(plan.split.is_none() && plan.partitions == 2);
    }
}

/// A GPU whose steps have no room for a split workspace: the walk kernel.
const WALK: DeviceLimits = DeviceLimits {
    num_sms: 132,
    decode_partition_keys: DECODE_PARTITION_KEYS,
    split_workspace_rows: 0,
};

#[test]
fn split_k_matches_the_cpu_kernel() {
    // Few sequences with long contexts: too few tiles for the GPU, so keys are split; a prefill
    // chunk rides in the same step and its tiles split too.
    let steps: [&[(usize, usize)]; 3] = [
        &[(3000, 1)],
        &[(700, 1), (2100, 1), (5, 1)],
        &[(1500, 1), (600, 40)],
    ];
    for (seed, seqs) in steps.iter().enumerate() {
        let plan = check(
            10 + seed as u64,
            seqs,
            (12, 2),
            128,
            16,
            DeviceLimits::HOPPER,
        );
        let split = plan.split.expect("long contexts of few sequences split");
        assert!(split.max_splits > 1);
        assert_eq!(plan.combine.unwrap().grid.0 as usize, plan.num_tokens * 12);
    }
}

#[test]
fn metadata_is_laid_out_as_the_kernel_reads_it() {
    let seqs = [
        SequenceSlice {
            query_start: 0,
            query_len: 5,
            context_len: 5,
            block_table_start: 0,
            block_table_len: 1,
        },
        SequenceSlice {
            query_start: 5,
            query_len: 1,
            context_len: 20,
            block_table_start: 1,
            block_table_len: 2,
        },
    ];
    let tables = [7, 3, 9];
    // Groups of 4: 4 tokens a tile, so the prefill of 5 takes two tiles.
    let shape = AttentionShape {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        window: None,
    };
    let plan = AttentionPlan::new(&seqs, &tables, 6, &shape, 16, DeviceLimits::HOPPER).unwrap();
    assert_eq!(plan.num_tiles, 3);
    assert_eq!(
        plan.metadata,
        [
            0, 0, 4, 1, 0, 4, 1, 1, 1, 0, 1, 1, // tiles
            0, 5, 5, 0, 5, 1, 20, 1, // sequences
            7, 3, 9, // block tables
            1, 1, 1, 1, 1, 1, // splits per token
        ]
    );
    assert_eq!(
        plan.offsets,
        MetadataOffsets {
            tiles: 0,
            seqs: 12,
            block_tables: 20,
            token_splits: 23
        }
    );
    assert_eq!(plan.attention.grid, (3, 2, 1));
    assert_eq!(plan.attention_shared_bytes(), 4 * (16 * 65 + 2 * 64 * 16));
    assert_eq!(plan.workspace_floats(), (0, 0));
}

#[test]
fn launches_do_not_grow_with_the_sequences() {
    let shape = AttentionShape {
        num_heads: 12,
        num_kv_heads: 2,
        head_dim: 128,
        scale: 0.088,
        window: None,
    };
    let mut rng = Rng(99);
    let launches = |seqs: &[(usize, usize)], rng: &mut Rng| {
        let blocks: usize = seqs.iter().map(|s| (s.0 + s.1).div_ceil(16)).sum();
        let st = step(rng, seqs, 16, blocks);
        let plan = AttentionPlan::new(
            &st.sequences,
            &st.block_tables,
            st.num_tokens,
            &shape,
            16,
            DeviceLimits::HOPPER,
        )
        .unwrap();
        (StepLaunches::new(&plan, 8960), plan)
    };
    // Decode steps of 1 to 256 sequences of 128-token prompts, plus one prefill in the step:
    // the same launches every time (the decode rows' partitions split, so the merge is one of
    // them), only the grid grows, and the fewer the tiles the more blocks each takes.
    let mut previous = (0, usize::MAX);
    let mut counts = Vec::new();
    for n in [1, 2, 8, 64, 256] {
        let mut seqs = vec![(128, 1); n];
        seqs.push((0, 128));
        let (l, plan) = launches(&seqs, &mut rng);
        let split = plan.split.expect("129 keys take 5 partitions");
        assert_eq!(split.max_splits, 5);
        assert!(plan.num_tiles > previous.0 && split.grid_splits <= previous.1);
        previous = (plan.num_tiles, split.grid_splits);
        counts.push(l.launches_per_layer());
    }
    assert!(counts.iter().all(|&c| c == counts[0]), "{counts:?}");
    assert_eq!(counts[0], 7);
    assert!(l_has_combine(&launches(&[(4000, 1)], &mut rng).0));
    // Rows of one partition: no merge.
    let (l, plan) = launches(&[(20, 1), (0, 30)], &mut rng);
    assert!(plan.split.is_none() && plan.partitions == 1);
    assert_eq!(l.launches_per_layer(), 6);
    assert!(!l_has_combine(&l));
}

fn l_has_combine(l: &StepLaunches) -> bool {
    l.per_layer
        .iter()
        .any(|(k, _)| *k == Kernel::AttentionCombine)
}

#[test]
fn unsupported_shapes_and_bad_steps_are_errors() {
    let seqs = [SequenceSlice {
        query_start: 0,
        query_len: 2,
        context_len: 2,
        block_table_start: 0,
        block_table_len: 1,
    }];
    let plan = |h, kvh, d, tables: &[u32], t| {
        let shape = AttentionShape {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            scale: 1.0,
            window: None,
        };
        AttentionPlan::new(&seqs, tables, t, &shape, 16, DeviceLimits::HOPPER)
    };
    assert_eq!(plan(4, 4, 96, &[0], 2).unwrap_err(), PlanError::HeadDim(96));
    assert!(matches!(
        plan(32, 1, 64, &[0], 2),
        Err(PlanError::Group { .. })
    ));
    assert!(matches!(
        plan(6, 4, 64, &[0], 2),
        Err(PlanError::Group { .. })
    ));
    assert!(matches!(plan(4, 4, 64, &[], 2), Err(PlanError::Step(_))));
    assert!(matches!(plan(4, 4, 64, &[0], 3), Err(PlanError::Step(_))));
    assert!(plan(4, 4, 64, &[0], 2).is_ok());
}

#[test]
fn swiglu_grid_covers_every_output_and_stays_bounded() {
    let d = swiglu_dims(3, 100);
    assert!(d.blocks() * SWIGLU_THREADS as usize >= 300);
    assert_eq!(swiglu_dims(100_000, 8960).grid.0, 65_535);
}

#[test]
fn decode_buckets_cover_every_batch_size_with_little_padding() {
    assert_eq!(decode_buckets(1), [1]);
    assert_eq!(decode_buckets(6), [1, 2, 4, 6]);
    let b = decode_buckets(256);
    assert_eq!(&b[..5], &[1, 2, 4, 8, 16]);
    assert_eq!(*b.last().unwrap(), 256);
    assert!(b.windows(2).all(|w| w[0] < w[1]));
    // Past 8, a step pads at most 7 rows.
    for n in 1..=256 {
        let bucket = b.iter().find(|&&x| x >= n).unwrap();
        assert!(bucket - n < 8.max(n / 2), "{n} -> {bucket}");
    }
}

/// The plan of a decode bucket holding `st`'s sequences (none when `None`), on an H100/H200.
fn bucket_plan(
    st: Option<&Step>,
    bucket: usize,
    max_context: usize,
    shape: &AttentionShape,
    bs: usize,
) -> AttentionPlan {
    let (sequences, tables) = st.map_or((&[][..], &[][..]), |st| {
        (&st.sequences[..], &st.block_tables[..])
    });
    AttentionPlan::for_decode_bucket(
        sequences,
        tables,
        bucket,
        max_context,
        shape,
        bs,
        DeviceLimits::HOPPER,
    )
    .unwrap()
}

/// Qwen2.5-1.5B's heads (12 query heads over 2 KV heads of 128), the shape of the decode
/// bucket and partition tests.
fn qwen_1_5b_shape() -> AttentionShape {
    AttentionShape {
        num_heads: 12,
        num_kv_heads: 2,
        head_dim: 128,
        scale: 1.0 / (128f32).sqrt(),
        window: None,
    }
}

/// A decode bucket's plan, emulated, gives the CPU kernel's attention for its real rows; its
/// layout and grid depend only on the bucket (what a captured graph bakes in), and its padding
/// rows read block 0 alone.
#[test]
fn decode_bucket_plans_match_the_cpu_kernel_with_a_fixed_layout() {
    let shape = qwen_1_5b_shape();
    let (bs, max_context) = (16, 4096);
    let mut rng = Rng(31);
    for (seqs, bucket) in [
        (vec![(37, 1)], 1),
        (vec![(100, 1), (5, 1), (300, 1)], 4),
        (vec![(2000, 1), (7, 1)], 8),
        (vec![(64, 1); 13], 16),
    ] {
        let blocks: usize = seqs
            .iter()
            .map(|s: &(usize, usize)| (s.0 + 1).div_ceil(bs))
            .sum();
        let layout = KvLayout {
            num_blocks: blocks + 3,
            block_size: bs,
            num_kv_heads: 2,
            head_dim: 128,
        };
        let st = step(&mut rng, &seqs, bs, layout.num_blocks);
        let plan = bucket_plan(Some(&st), bucket, max_context, &shape, bs);
        let empty = bucket_plan(None, bucket, max_context, &shape, bs);
        // A step loop's plan refills the last one's words: the same plan.
        let refilled = AttentionPlan::for_decode_bucket_in(
            vec![7; 3 * plan.metadata.len()],
            &st.sequences,
            &st.block_tables,
            bucket,
            max_context,
            &shape,
            bs,
            DeviceLimits::HOPPER,
        )
        .unwrap();
        assert_eq!(refilled.metadata, plan.metadata);
        assert_eq!(plan.offsets, empty.offsets);
        assert_eq!(plan.attention, empty.attention);
        assert_eq!(plan.combine, empty.combine);
        assert_eq!(plan.split, empty.split);
        assert_eq!(plan.workspace_floats(), empty.workspace_floats());
        // Room for the most partitions a row of `max_context` keys takes; a grid by the bucket.
        let most = MAX_DECODE_SPLITS.min(max_context.div_ceil(DECODE_PARTITION_KEYS));
        let split = plan.split.unwrap();
        assert_eq!(split.max_splits, most);
        assert_eq!(
            split.grid_splits,
            (8 * 132usize).div_ceil(2 * bucket).min(most)
        );

        let n = layout.values_per_layer();
        let k: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        let q: Vec<f32> = (0..bucket * 12 * 128).map(|_| 2.0 * rng.unit()).collect();
        let real = st.num_tokens * 12 * 128;
        let mut want = vec![0f32; real];
        attention::paged_attention(
            &q[..real],
            &k,
            &v,
            &layout,
            &st.sequences,
            &[],
            &st.block_tables,
            &shape,
            None,
            &mut want,
        )
        .unwrap();
        let got = emulate(&plan, &q, &k, &v, &layout);
        for (i, (g, w)) in got[..real].iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{seqs:?} in {bucket}: element {i}: {g} vs {w}"
            );
        }
        assert!(got[real..].iter().all(|x| x.is_finite()));
    }
    // More sequences than the bucket, a prefill chunk, or a context past the maximum: errors.
    let one = |query_len: usize, context_len: usize| SequenceSlice {
        query_start: 0,
        query_len,
        context_len,
        block_table_start: 0,
        block_table_len: context_len.div_ceil(bs),
    };
    let tables = vec![0u32; 300];
    let bucket_plan = |seqs: &[SequenceSlice], bucket| {
        AttentionPlan::for_decode_bucket(
            seqs,
            &tables,
            bucket,
            max_context,
            &shape,
            bs,
            DeviceLimits::HOPPER,
        )
    };
    assert!(bucket_plan(&[one(2, 10)], 1).is_err());
    assert!(bucket_plan(&[one(1, 4097)], 1).is_err());
    let two = [
        one(1, 5),
        SequenceSlice {
            query_start: 1,
            ..one(1, 5)
        },
    ];
    assert!(bucket_plan(&two, 1).is_err());
    assert!(bucket_plan(&two, 2).is_ok());
}

/// A decode row's partitions, whatever the number of its keys and the partition length: each
/// a whole number of chunks, none empty, together exactly its keys, none longer than asked
/// unless the count is at its bound.
#[test]
fn decode_splits_cover_the_keys_without_empty_partitions() {
    for partition in [16, 32, 64, 128, 256] {
        for keys in 1..5000 {
            let splits = decode_splits(keys, partition);
            let length = partition_keys(keys, splits);
            assert!(
                (1..=MAX_DECODE_SPLITS).contains(&splits),
                "{keys} keys, {partition}"
            );
            assert!(length.is_multiple_of(ATTN_KEYS));
            assert!(splits * length >= keys, "{keys} keys: {splits} x {length}");
            assert!(
                (splits - 1) * length < keys,
                "{keys} keys: an empty partition"
            );
            let clamped = keys.div_ceil(MAX_DECODE_SPLITS).next_multiple_of(ATTN_KEYS);
            assert!(length <= partition.max(clamped), "{keys} keys: {length}");
        }
    }
}

/// Batch invariance of the plan: a decode row takes the same partitions, and its emulated
/// attention is the same to the bit, alone in an eager step, in a crowd of other decode rows
/// and prefill chunks, in a decode bucket of any size, with its partitions walked by a block
/// each or by one block; the row's result depends on its context alone.
#[test]
fn a_decode_row_splits_by_its_context_alone() {
    let shape = qwen_1_5b_shape();
    let (bs, max_context) = (16, 4096);
    let mut rng = Rng(57);
    for context in [1usize, 15, 16, 17, 63, 64, 65, 200, 257, 1000, 3000] {
        // The row of interest is sequence 0 of every step below, with the same blocks.
        let crowds: [&[(usize, usize)]; 4] = [
            &[],
            &[(40, 1), (900, 1)],
            &[(5, 1), (0, 70), (2000, 1)],
            &[(128, 1); 20],
        ];
        let others: usize = crowds
            .iter()
            .flat_map(|c| c.iter())
            .map(|s| (s.0 + s.1).div_ceil(bs))
            .sum();
        let layout = KvLayout {
            num_blocks: context.div_ceil(bs) + others + 2,
            block_size: bs,
            num_kv_heads: 2,
            head_dim: 128,
        };
        let n = layout.values_per_layer();
        let k: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        let q_row: Vec<f32> = (0..12 * 128).map(|_| 2.0 * rng.unit()).collect();
        let mut results: Vec<(String, usize, Vec<f32>)> = Vec::new();
        for (c, crowd) in crowds.iter().enumerate() {
            let mut seqs = vec![(context - 1, 1)];
            seqs.extend_from_slice(crowd);
            let mut st = step(&mut rng, &seqs, bs, layout.num_blocks);
            // The row's own blocks: the same in every step.
            let own = context.div_ceil(bs);
            st.block_tables[..own]
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = i as u32);
            let others_start = own;
            for (i, b) in st.block_tables[others_start..].iter_mut().enumerate() {
                *b = (own + i) as u32;
            }
            let mut q: Vec<f32> = (0..st.num_tokens * 12 * 128)
                .map(|_| 2.0 * rng.unit())
                .collect();
            q[..q_row.len()].copy_from_slice(&q_row);
            for (kernel, limits) in [("split", DeviceLimits::HOPPER), ("walk", WALK)] {
                let eager = AttentionPlan::new(
                    &st.sequences,
                    &st.block_tables,
                    st.num_tokens,
                    &shape,
                    bs,
                    limits,
                )
                .unwrap();
                let out = emulate(&eager, &q, &k, &v, &layout);
                results.push((
                    format!("eager, {kernel} kernel, crowd {c}"),
                    eager.metadata[3] as usize,
                    out[..q_row.len()].to_vec(),
                ));
            }
            if crowd.iter().all(|s| s.1 == 1) {
                for bucket in decode_buckets(64).into_iter().filter(|&b| b >= seqs.len()) {
                    let plan = bucket_plan(Some(&st), bucket, max_context, &shape, bs);
                    let mut qb = q.clone();
                    qb.resize(bucket * 12 * 128, 0.5);
                    let out = emulate(&plan, &qb, &k, &v, &layout);
                    results.push((
                        format!("bucket {bucket}, crowd {c}"),
                        plan.metadata[3] as usize,
                        out[..q_row.len()].to_vec(),
                    ));
                }
            }
        }
        let (_, splits, alone) = &results[0];
        assert_eq!(*splits, decode_splits(context, DECODE_PARTITION_KEYS));
        for (name, s, out) in &results[1..] {
            assert_eq!(s, splits, "{context} keys, {name}");
            let same = out
                .iter()
                .zip(alone)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{context} keys, {name}: not the row alone's bits");
        }
    }
}

#[test]
fn the_decode_partition_knob_takes_whole_chunks_only() {
    assert_eq!(decode_partition_keys(None), Ok(DECODE_PARTITION_KEYS));
    assert_eq!(decode_partition_keys(Some("32")), Ok(32));
    assert_eq!(decode_partition_keys(Some(" 256 ")), Ok(256));
    for bad in ["0", "24", "-16", "sixty-four", ""] {
        let err = decode_partition_keys(Some(bad)).unwrap_err().to_string();
        assert!(err.contains(DECODE_PARTITION_VAR), "{bad}: {err}");
    }
}
