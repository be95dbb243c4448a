use half::f16;

use super::*;

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

/// One step of sequences given as (query tokens, tokens already cached), each on blocks
/// taken from the end of the pool, with random queries and cache.
struct Step {
    layout: KvLayout,
    shape: AttentionShape,
    sequences: Vec<SequenceSlice>,
    /// `[T]` each query's key end, or empty: causal.
    key_ends: Vec<u32>,
    block_tables: Vec<u32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// One logit per query head, where the step has attention sinks.
    sinks: Option<Vec<f32>>,
}

/// Which keys a query sees beyond the causal rule: a sliding window, and attention sinks
/// (a logit per head in the softmax's denominator).
#[derive(Debug, Clone, Copy)]
struct Masking {
    window: Option<usize>,
    sinks: bool,
    /// A run of each sequence's queries that sees the whole run (an image's tokens).
    images: bool,
}

/// Full attention, sliding windows that start inside 16-key chunks, on block edges and past
/// every context, sinks with and without a window, and image runs with and without both.
const MASKINGS: [Masking; 10] = [
    Masking {
        window: None,
        sinks: false,
        images: false,
    },
    Masking {
        window: Some(1),
        sinks: false,
        images: false,
    },
    Masking {
        window: Some(13),
        sinks: false,
        images: false,
    },
    Masking {
        window: Some(16),
        sinks: false,
        images: false,
    },
    Masking {
        window: Some(40),
        sinks: false,
        images: false,
    },
    Masking {
        window: None,
        sinks: true,
        images: false,
    },
    Masking {
        window: Some(13),
        sinks: true,
        images: false,
    },
    Masking {
        window: None,
        sinks: false,
        images: true,
    },
    Masking {
        window: Some(13),
        sinks: false,
        images: true,
    },
    Masking {
        window: Some(40),
        sinks: true,
        images: true,
    },
];

/// Every one of `shapes` with every masking of [`MASKINGS`].
fn with_windows<T: Copy>(shapes: &[T]) -> Vec<(T, Masking)> {
    shapes
        .iter()
        .flat_map(|&s| MASKINGS.map(move |m| (s, m)))
        .collect()
}

fn step_with_window(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    masking: Masking,
) -> Step {
    let mut s = step(heads, kv_heads, head_dim, block_size);
    s.shape.window = masking.window;
    // Sinks about as large as the scores, so that they matter: from -2 to 3.
    s.sinks = masking
        .sinks
        .then(|| values(heads, 4).iter().map(|x| 2.5 * x + 0.5).collect());
    if masking.images {
        s.key_ends = image_key_ends(&s.sequences);
    }
    s
}

/// Key ends where the queries from a quarter to three quarters of each sequence's chunk are
/// an image (each sees up to the run's last); a run of one where the chunk is short. Queries
/// before the run are causal; after it, too.
fn image_key_ends(sequences: &[SequenceSlice]) -> Vec<u32> {
    let t = sequences
        .iter()
        .map(|s| s.query_start + s.query_len)
        .max()
        .unwrap_or(0);
    let mut ends = vec![0u32; t];
    for s in sequences {
        let first_pos = s.context_len - s.query_len;
        let (a, b) = (
            s.query_len / 4,
            (3 * s.query_len / 4).max(s.query_len / 4 + 1),
        );
        for i in 0..s.query_len {
            let end = if (a..b).contains(&i) {
                first_pos + b
            } else {
                first_pos + i + 1
            };
            ends[s.query_start + i] = end as u32;
        }
    }
    ends
}

fn step(heads: usize, kv_heads: usize, head_dim: usize, block_size: usize) -> Step {
    let shapes = [
        (1usize, 0usize),
        (1, 15),
        (1, 16),
        (3, 13),
        (17, 0),
        (20, 31),
        (1, 47),
        (40, 0),
        (1, 70),
    ];
    let num_blocks = shapes
        .iter()
        .map(|(q, c)| (q + c).div_ceil(block_size))
        .sum::<usize>()
        + 2;
    let layout = KvLayout {
        num_blocks,
        block_size,
        num_kv_heads: kv_heads,
        head_dim,
    };
    let (mut sequences, mut block_tables) = (Vec::new(), Vec::new());
    let (mut next_block, mut query_start) = (num_blocks as u32, 0);
    for &(query_len, cached) in &shapes {
        let context_len = query_len + cached;
        let blocks = context_len.div_ceil(block_size);
        sequences.push(SequenceSlice {
            query_start,
            query_len,
            context_len,
            block_table_start: block_tables.len(),
            block_table_len: blocks,
        });
        for _ in 0..blocks {
            next_block -= 1;
            block_tables.push(next_block);
        }
        query_start += query_len;
    }
    let n = layout.values_per_layer();
    Step {
        layout,
        shape: AttentionShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
        },
        q: values(query_start * heads * head_dim, 1)
            .iter()
            .map(|x| x * 3.0)
            .collect(),
        k: values(n, 2),
        v: values(n, 3),
        sequences,
        key_ends: Vec::new(),
        block_tables,
        sinks: None,
    }
}

fn run<E: KvElem>(path: Path, s: &Step, k: &[E], v: &[E]) -> Vec<f32> {
    let mut out = vec![0f32; s.q.len()];
    run_items(
        path,
        &s.q,
        k,
        v,
        &s.layout,
        &s.sequences,
        &s.key_ends,
        &s.block_tables,
        &s.shape,
        s.sinks.as_deref(),
        &mut out,
    )
    .unwrap();
    out
}

/// The vector paths this CPU runs, or `None` where it has neither.
fn vector_paths() -> Option<Vec<Path>> {
    let (avx512, avx2) = cpu_features();
    let paths: Vec<Path> = [(avx512, Path::Avx512), (avx2, Path::Avx2)]
        .into_iter()
        .filter_map(|(has, p)| has.then_some(p))
        .collect();
    (!paths.is_empty()).then_some(paths)
}

/// Every vector path this CPU runs agrees with the portable one, on f32 and f16 caches,
/// for every group size, block sizes that do and do not hold whole 16-key chunks, decode
/// rows and prefill runs; and the AVX-512 and AVX2 kernels, where both run, bit for bit.
#[test]
fn vector_paths_match_portable() {
    let Some(paths) = vector_paths() else {
        eprintln!("skipped: neither AVX-512 nor AVX2 on this CPU");
        return;
    };
    for (heads, kv_heads) in [
        (1, 1),
        (4, 2),
        (9, 3),
        (8, 2),
        (10, 2),
        (12, 2),
        (14, 2),
        (8, 1),
    ] {
        // 48: a 32-dimension values pass, then a 16-dimension one.
        for ((head_dim, block_size), window) in
            with_windows(&[(64, 16), (64, 20), (32, 8), (128, 32), (16, 1), (48, 16)])
        {
            let s = step_with_window(heads, kv_heads, head_dim, block_size, window);
            let k16: Vec<f16> = s.k.iter().map(|&x| f16::from_f32(x)).collect();
            let v16: Vec<f16> = s.v.iter().map(|&x| f16::from_f32(x)).collect();
            let want32 = run(Path::Portable, &s, &s.k, &s.v);
            let want16 = run(Path::Portable, &s, &k16, &v16);
            // The AVX-512 and AVX2 kernels compute each lane alike: the same bits.
            if let [first, second] = paths[..] {
                let same = |a: Vec<f32>, b: Vec<f32>| {
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits())
                };
                assert!(
                        same(run(first, &s, &s.k, &s.v), run(second, &s, &s.k, &s.v))
                            && same(run(first, &s, &k16, &v16), run(second, &s, &k16, &v16)),
                        "heads {heads}/{kv_heads} of {head_dim}, blocks of {block_size}, window {window:?}: AVX-512 and AVX2 differ"
                    );
            }
            for &path in &paths {
                for (got, want) in [
                    (run(path, &s, &s.k, &s.v), &want32),
                    (run(path, &s, &k16, &v16), &want16),
                ] {
                    let diff = got
                        .iter()
                        .zip(want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(
                            diff < 2e-6,
                            "{path:?}, heads {heads}/{kv_heads} of {head_dim}, blocks of {block_size}, window {window:?}: differs from portable by {diff}"
                        );
                }
            }
        }
    }
}

/// The portable path against attention written out in f64 from its definition: causal (or
/// to an image's end), within the window, each sink a key without a value in its head's
/// softmax.
#[test]
fn portable_path_matches_the_definition_with_windows_and_sinks() {
    for (heads, kv_heads) in [(1, 1), (4, 2), (9, 3)] {
        for ((head_dim, block_size), masking) in with_windows(&[(32, 16), (16, 5)]) {
            let s = step_with_window(heads, kv_heads, head_dim, block_size, masking);
            let got = run(Path::Portable, &s, &s.k, &s.v);
            let group = heads / kv_heads;
            for seq in &s.sequences {
                let table = seq.block_table(&s.block_tables);
                let slot =
                    |key: usize| table[key / block_size] as usize * block_size + key % block_size;
                for i in 0..seq.query_len {
                    let pos = seq.context_len - seq.query_len + i;
                    let first = masking.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let token = seq.query_start + i;
                    // Causal, or to the end of the image the token is in.
                    let end = s.key_ends.get(token).map_or(pos + 1, |&e| e as usize);
                    for head in 0..heads {
                        let kv = head / group;
                        let q = &s.q[(token * heads + head) * head_dim..][..head_dim];
                        let scores: Vec<f64> = (first..end)
                            .map(|key| {
                                let dot: f64 = (0..head_dim)
                                    .map(|d| {
                                        f64::from(q[d])
                                            * f64::from(s.k[s.layout.k_offset(slot(key), kv, d)])
                                    })
                                    .sum();
                                dot * f64::from(s.shape.scale)
                            })
                            .collect();
                        let sink = s.sinks.as_ref().map(|x| f64::from(x[head]));
                        let max = scores.iter().copied().chain(sink).fold(f64::MIN, f64::max);
                        let denom: f64 = scores
                            .iter()
                            .chain(sink.as_ref())
                            .map(|x| (x - max).exp())
                            .sum();
                        for d in 0..head_dim {
                            let want: f64 = scores
                                .iter()
                                .zip(first..end)
                                .map(|(x, key)| {
                                    (x - max).exp() / denom
                                        * f64::from(s.v[s.layout.v_offset(slot(key), kv, d)])
                                })
                                .sum();
                            let g = got[(token * heads + head) * head_dim + d];
                            assert!(
                                    (f64::from(g) - want).abs() < 1e-5,
                                    "heads {heads}/{kv_heads}, {masking:?}, token {token} head {head} dim {d}: {g} vs {want}"
                                );
                        }
                    }
                }
            }
        }
    }
}

/// Sinks are one finite logit per query head, else a shape error rather than a read past
/// their end.
#[test]
fn sinks_of_the_wrong_count_or_not_finite_are_refused() {
    let s = step(4, 2, 32, 16);
    let mut out = vec![0f32; s.q.len()];
    for sinks in [vec![0.0; 3], vec![0.0, 1.0, f32::NAN, 2.0]] {
        let err = run_items(
            Path::Portable,
            &s.q,
            &s.k,
            &s.v,
            &s.layout,
            &s.sequences,
            &s.key_ends,
            &s.block_tables,
            &s.shape,
            Some(&sinks),
            &mut out,
        )
        .unwrap_err();
        assert!(err.to_string().contains("sinks"), "{err}");
    }
}

/// A prefill's rows equal, bit for bit, its queries run one at a time as decode rows over
/// the same blocks: taking several queries a call (the AVX2 kernel's tiles) changes no
/// row's arithmetic, so a prompt's result does not depend on how it was chunked.
#[test]
fn prefill_rows_equal_their_queries_one_at_a_time() {
    let Some(paths) = vector_paths() else {
        eprintln!("skipped: neither AVX-512 nor AVX2 on this CPU");
        return;
    };
    // Groups of 1, 2 and 3 take 6, 3 and 2 queries a call on AVX2 (8, 4 and 2 on AVX-512);
    // 4 takes 2 on AVX-512 (8 rows); 6 takes one on both.
    for (heads, kv_heads) in [(2, 2), (4, 2), (9, 3), (8, 2), (12, 2)] {
        for ((head_dim, block_size), window) in
            with_windows(&[(64, 16), (64, 20), (32, 8), (128, 32)])
        {
            let s = step_with_window(heads, kv_heads, head_dim, block_size, window);
            let k16: Vec<f16> = s.k.iter().map(|&x| f16::from_f32(x)).collect();
            let v16: Vec<f16> = s.v.iter().map(|&x| f16::from_f32(x)).collect();
            // Every query token of every sequence as its own one-token sequence at its
            // position, over the same block table; an image's tokens, which see each other,
            // as one sequence of their own (a chunk that starts at the image and ends with
            // it, as the scheduler may cut one).
            let mut one_at_a_time: Vec<SequenceSlice> = Vec::new();
            for seq in &s.sequences {
                let first_pos = seq.context_len - seq.query_len;
                let mut i = 0;
                while i < seq.query_len {
                    let token = seq.query_start + i;
                    let end = s
                        .key_ends
                        .get(token)
                        .map_or(first_pos + i + 1, |&e| e as usize);
                    let len = end - (first_pos + i);
                    one_at_a_time.push(SequenceSlice {
                        query_start: token,
                        query_len: len,
                        context_len: end,
                        ..*seq
                    });
                    i += len;
                }
            }
            let singles = Step {
                sequences: one_at_a_time,
                q: s.q.clone(),
                k: Vec::new(),
                v: Vec::new(),
                block_tables: s.block_tables.clone(),
                sinks: s.sinks.clone(),
                key_ends: s.key_ends.clone(),
                ..s
            };
            // The first output value that differs, as (token, head, dimension).
            let first_difference = |a: Vec<f32>, b: Vec<f32>| {
                a.iter()
                    .zip(&b)
                    .position(|(x, y)| x.to_bits() != y.to_bits())
                    .map(|i| (i / (heads * head_dim), i / head_dim % heads, i % head_dim))
            };
            for &path in &paths {
                let what = format!(
                    "{path:?}, heads {heads}/{kv_heads} of {head_dim}, blocks of {block_size}, {window:?}"
                );
                let f32_rows =
                    first_difference(run(path, &singles, &s.k, &s.v), run(path, &s, &s.k, &s.v));
                assert_eq!(
                    f32_rows, None,
                    "{what}, f32 cache: (token, head, dim) differs"
                );
                let f16_rows =
                    first_difference(run(path, &singles, &k16, &v16), run(path, &s, &k16, &v16));
                assert_eq!(
                    f16_rows, None,
                    "{what}, f16 cache: (token, head, dim) differs"
                );
            }
        }
    }
}

/// A path this CPU lacks, or a shape it does not cover, is an error rather than a fault.
#[test]
fn a_path_the_cpu_or_shape_lacks_is_refused() {
    let s = step(4, 2, 24, 16);
    let err = std::panic::catch_unwind(|| {
        let mut out = vec![0f32; s.q.len()];
        run_items(
            Path::Avx2,
            &s.q,
            &s.k,
            &s.v,
            &s.layout,
            &s.sequences,
            &s.key_ends,
            &s.block_tables,
            &s.shape,
            s.sinks.as_deref(),
            &mut out,
        )
    })
    .expect("no panic");
    assert_eq!(
        err,
        Err(AttentionError::Unsupported {
            head_dim: 24,
            group: 2
        })
    );
}

/// The step's keys and values written into an 8-bit cache, slot by slot, from the f32
/// cache the other tests read.
fn q8_cache(s: &Step) -> (Vec<i8>, Vec<f32>, Vec<i8>, Vec<f32>) {
    let l = &s.layout;
    let (n, ns) = (l.values_per_layer(), Q8Cache::scales_per_layer(l));
    let (mut k, mut ks, mut v, mut vs) =
        (vec![0i8; n], vec![0f32; ns], vec![0i8; n], vec![0f32; ns]);
    let d = l.head_dim;
    for slot in 0..l.num_slots() {
        let (block, off) = (slot / l.block_size, slot % l.block_size);
        let mut kr = vec![0f32; l.num_kv_heads * d];
        let mut vr = kr.clone();
        for head in 0..l.num_kv_heads {
            let base = l.block_head_offset(block, head);
            for i in 0..d {
                kr[head * d + i] = s.k[base + i * l.block_size + off];
                vr[head * d + i] = s.v[base + off * d + i];
            }
        }
        let cache = Q8CacheMut {
            k: &mut k,
            k_scales: &mut ks,
            v: &mut v,
            v_scales: &mut vs,
        };
        write_q8(l, &[slot as u32], &kr, &vr, cache).unwrap();
    }
    (k, ks, v, vs)
}

/// The 8-bit cache: AVX2 (where the CPU has it) agrees with the portable path on the same
/// integers, and both stay within the quantization error of the f32 cache's attention.
#[test]
fn q8_cache_paths_agree_and_track_f32() {
    for (heads, kv_heads) in [(1, 1), (9, 3), (12, 2), (14, 2)] {
        for ((head_dim, block_size), window) in
            with_windows(&[(64, 16), (64, 20), (32, 8), (128, 32)])
        {
            let s = step_with_window(heads, kv_heads, head_dim, block_size, window);
            let (k, ks, v, vs) = q8_cache(&s);
            let cache = Q8Cache {
                k: &k,
                k_scales: &ks,
                v: &v,
                v_scales: &vs,
            };
            let run_q8 = |avx2: bool| {
                let mut out = vec![0f32; s.q.len()];
                run_q8_items_for_test(avx2, &s, &cache, &mut out);
                out
            };
            let portable = run_q8(false);
            let exact = run(Path::Portable, &s, &s.k, &s.v);
            let err = portable
                .iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                err < 0.03,
                "q8 vs f32, heads {heads}/{kv_heads} of {head_dim}, window {window:?}: {err}"
            );
            if cpu_features().1 {
                let fast = run_q8(true);
                let diff = fast
                    .iter()
                    .zip(&portable)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(diff < 2e-6, "q8 AVX2 vs portable, heads {heads}/{kv_heads} of {head_dim}, blocks of {block_size}, window {window:?}: {diff}");
            }
        }
    }
}

fn run_q8_items_for_test(avx2: bool, s: &Step, cache: &Q8Cache<'_>, out: &mut [f32]) {
    q8::run_q8_items(
        avx2,
        &s.q,
        cache,
        &s.layout,
        &s.sequences,
        &s.key_ends,
        &s.block_tables,
        &s.shape,
        s.sinks.as_deref(),
        out,
    )
    .unwrap();
}

#[test]
fn q8_write_round_trips_within_half_a_step() {
    let s = step(4, 2, 64, 16);
    let (k, ks, _, _) = q8_cache(&s);
    let l = &s.layout;
    for slot in [0usize, 5, 17, l.num_slots() - 1] {
        let (block, off) = (slot / l.block_size, slot % l.block_size);
        for head in 0..2 {
            let base = l.block_head_offset(block, head);
            for i in 0..64 {
                let at = base + i * l.block_size + off;
                let scale = ks[((block * 2 + head) * 2 + i / 32) * l.block_size + off];
                let back = f32::from(k[at]) * scale;
                assert!(
                    (back - s.k[at]).abs() <= scale * 0.5 + 1e-7,
                    "{back} vs {}",
                    s.k[at]
                );
            }
        }
    }
}

#[test]
fn q8_refuses_a_head_dim_off_its_groups() {
    let s = step(4, 2, 16, 16);
    let n = s.layout.values_per_layer();
    let (k, ks) = (vec![0i8; n], vec![0f32; n]);
    let cache = Q8Cache {
        k: &k,
        k_scales: &ks,
        v: &k,
        v_scales: &ks,
    };
    let mut out = vec![0f32; s.q.len()];
    let err = paged_attention_q8(
        &s.q,
        &cache,
        &s.layout,
        &s.sequences,
        &s.key_ends,
        &s.block_tables,
        &s.shape,
        s.sinks.as_deref(),
        &mut out,
    );
    assert!(matches!(
        err,
        Err(AttentionError::Unsupported { head_dim: 16, .. })
    ));
}

#[test]
fn f16_write_lands_in_each_slot_and_refuses_bad_rows() {
    let layout = KvLayout {
        num_blocks: 2,
        block_size: 4,
        num_kv_heads: 2,
        head_dim: 8,
    };
    let n = layout.values_per_layer();
    let (mut kc, mut vc) = (vec![half::f16::ZERO; n], vec![half::f16::ZERO; n]);
    let width = 2 * 8;
    let k: Vec<f32> = (0..2 * width).map(|i| i as f32 * 0.5).collect();
    let v: Vec<f32> = k.iter().map(|x| -x).collect();
    let slots = [6, 1];
    write_kv(&layout, &slots, &k, &v, &mut kc, &mut vc).unwrap();
    for (t, &slot) in slots.iter().enumerate() {
        for h in 0..2 {
            for i in 0..8 {
                let want = k[(t * 2 + h) * 8 + i];
                assert_eq!(f32::from(kc[layout.k_offset(slot as usize, h, i)]), want);
                assert_eq!(f32::from(vc[layout.v_offset(slot as usize, h, i)]), -want);
            }
        }
    }
    let past = write_kv(&layout, &[8, 1], &k, &v, &mut kc, &mut vc);
    assert!(matches!(past, Err(AttentionError::Shape(_))));
    let short = write_kv(&layout, &slots, &k[..width], &v, &mut kc, &mut vc);
    assert!(matches!(short, Err(AttentionError::Shape(_))));
}

/// Key ends that are not one a token, that fall below a query's own position + 1, pass the
/// context or decrease along a sequence are refused before any kernel reads with them.
#[test]
fn bad_key_ends_are_refused() {
    let s = step(4, 2, 32, 16);
    let good = image_key_ends(&s.sequences);
    let seq = &s.sequences[5]; // 20 queries after 31 cached tokens
    let first = seq.query_start;
    let mut below = good.clone();
    below[first + 1] = (seq.context_len - seq.query_len) as u32; // position + 1 is 33
    let mut past = good.clone();
    past[first + seq.query_len - 1] = seq.context_len as u32 + 1;
    let mut decreasing = good.clone();
    decreasing[first + 10] = decreasing[first + 9] - 1;
    for ends in [good[..good.len() - 1].to_vec(), below, past, decreasing] {
        let mut out = vec![0f32; s.q.len()];
        let err = run_items(
            Path::Portable,
            &s.q,
            &s.k,
            &s.v,
            &s.layout,
            &s.sequences,
            &ends,
            &s.block_tables,
            &s.shape,
            None,
            &mut out,
        )
        .unwrap_err();
        assert!(err.to_string().contains("key ends"), "{err}");
    }
}
