//! The vision tower (`sluice_model::vision`) against its oracle: llama.cpp's preprocessing
//! and Gemma 3 SigLIP tower as `scripts/vision-ref.py` reproduces them in numpy, on the tiny
//! random-weight projector `scripts/make-vision-models.sh` writes
//! (`models/tiny-gemma3-vision/`, pinned by `tests/fixtures/vision/SHA256SUMS`), and the
//! three test images of `tests/fixtures/vision/`.
//!
//! - Preprocessing is integer arithmetic up to one f32 division and normalisation: it must
//!   equal the reference bit for bit (no model needed).
//! - Embeddings agree with the f64 reference within [`F32_TOLERANCE`]: not bit for bit,
//!   because the reference sums in f64 and in numpy's order, where the tower sums in f32 in
//!   its kernels' order (FMA chains over panels, f32 softmax and GELU).
//! - The F16 file (the same values in f16) gives the F32 file's embeddings bit for bit: both
//!   multiply f32 panels.
//! - An image's embeddings are the same bits alone or among others, in any order, on every
//!   kernel tier of this CPU (`sluice_kernels::cpu::limit_kernels`, process-wide: the tests
//!   of this binary give the same bits on any tier, so forcing one harms no other).
//! - Bad files (a missing tensor, a wrong shape, an unknown projector type, a missing key)
//!   are errors that name what is wrong; these tests write their own small files and need no
//!   model.
//!
//! Without the models the tests that need them say that they skipped and which script makes
//! them (scripts/test.sh runs it, so CI does).

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use serde_json::Value as Json;
use sluice_kernels::cpu::KernelTier;
use sluice_model::testing::optional_model;
use sluice_model::vision::{self, ProjectorKind, VisionSpec, VisionTower};

/// Largest difference of an embedding from the f64 reference on the F32 file (values of rms
/// ~0.85): f32 rounding through three layers (measured: at most 1.5e-6 on both files, 2026-12-04).
const F32_TOLERANCE: f32 = 1e-5;

/// Largest difference of the Q8_0 file's embeddings from the F32 file's reference (measured:
/// at most 3.0e-2 on values of rms ~0.85, 2026-12-04).
const Q8_0_TOLERANCE: f32 = 0.05;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vision")
}

fn reference() -> Json {
    let text = std::fs::read_to_string(fixtures().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn model(name: &str) -> Option<PathBuf> {
    optional_model(
        &format!("tiny-gemma3-vision/{name}"),
        "scripts/make-vision-models.sh",
    )
}

/// One test image of the fixtures: name, RGB8 bytes, width, height.
struct Image {
    name: String,
    rgb: Vec<u8>,
    width: usize,
    height: usize,
    resized: Vec<u8>,
    embeddings: Vec<f32>,
}

fn images(reference: &Json) -> Vec<Image> {
    reference["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|img| {
            let read =
                |key: &str| std::fs::read(fixtures().join(img[key].as_str().unwrap())).unwrap();
            Image {
                name: img["name"].as_str().unwrap().to_string(),
                rgb: read("rgb"),
                width: img["width"].as_u64().unwrap() as usize,
                height: img["height"].as_u64().unwrap() as usize,
                resized: read("resized"),
                embeddings: img["embeddings"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|row| {
                        row.as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_f64().unwrap() as f32)
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The tiny projector's spec as the reference was made with it (mean and std 0.5).
fn tiny_spec(reference: &Json) -> VisionSpec {
    VisionSpec {
        projector: ProjectorKind::Gemma3,
        image_size: reference["image_size"].as_u64().unwrap() as usize,
        patch_size: 14,
        tokens_per_image: reference["tokens_per_image"].as_u64().unwrap() as usize,
        embedding_width: 64,
        image_mean: [0.5; 3],
        image_std: [0.5; 3],
    }
}

#[test]
fn preprocessing_equals_llama_cpps_bit_for_bit() {
    let reference = reference();
    let spec = tiny_spec(&reference);
    let table: Vec<Vec<f32>> = reference["normalized"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ch| {
            ch.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    for img in images(&reference) {
        let resized =
            vision::resize_to_square(&img.rgb, img.width, img.height, spec.image_size).unwrap();
        if let Some(i) = resized.iter().zip(&img.resized).position(|(a, b)| a != b) {
            panic!(
                "{}: resized byte {i} (pixel {}, channel {}) is {}, llama.cpp's {}",
                img.name,
                i / 3,
                i % 3,
                resized[i],
                img.resized[i]
            );
        }
        assert_eq!(resized.len(), img.resized.len(), "{}", img.name);
        let pixels = vision::preprocess(&spec, &img.rgb, img.width, img.height).unwrap();
        assert_eq!(pixels.len(), spec.pixels_per_image());
        for (i, (&got, &byte)) in pixels.iter().zip(&img.resized).enumerate() {
            let want = table[i % 3][byte as usize];
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{} value {i}: {got} vs {want}",
                img.name
            );
        }
    }
}

fn open(name: &str) -> Option<VisionTower> {
    let path = model(name)?;
    Some(VisionTower::open(&path).unwrap_or_else(|e| panic!("{name}: {e}")))
}

fn encode(tower: &VisionTower, pixels: &[&[f32]]) -> Vec<f32> {
    let spec = tower.spec();
    let mut out = vec![0f32; pixels.len() * spec.tokens_per_image * spec.embedding_width];
    tower.encode(pixels, &mut out).unwrap();
    out
}

fn preprocessed(tower: &VisionTower, imgs: &[Image]) -> Vec<Vec<f32>> {
    imgs.iter()
        .map(|img| vision::preprocess(tower.spec(), &img.rgb, img.width, img.height).unwrap())
        .collect()
}

#[test]
fn the_spec_is_the_files() {
    let Some(tower) = open("mmproj-f32.gguf") else {
        return;
    };
    let reference = reference();
    assert_eq!(tower.spec(), &tiny_spec(&reference));
}

#[test]
fn embeddings_match_the_numpy_reference() {
    let reference = reference();
    let imgs = images(&reference);
    for file in ["mmproj-f32.gguf", "mmproj-f16.gguf"] {
        let Some(tower) = open(file) else {
            return;
        };
        let pixels = preprocessed(&tower, &imgs);
        let refs: Vec<&[f32]> = pixels.iter().map(Vec::as_slice).collect();
        let got = encode(&tower, &refs);
        let per_image = got.len() / imgs.len();
        for (img, got) in imgs.iter().zip(got.chunks_exact(per_image)) {
            assert_eq!(got.len(), img.embeddings.len(), "{file} {}", img.name);
            let worst = got
                .iter()
                .zip(&img.embeddings)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            eprintln!(
                "{file} {}: largest difference from the reference {worst:.2e}",
                img.name
            );
            assert!(
                worst <= F32_TOLERANCE,
                "{file} {}: {worst} from the reference",
                img.name
            );
        }
    }
}

#[test]
fn the_f16_file_gives_the_f32_files_embeddings_bit_for_bit() {
    let (Some(f32_tower), Some(f16_tower)) = (open("mmproj-f32.gguf"), open("mmproj-f16.gguf"))
    else {
        return;
    };
    let imgs = images(&reference());
    let pixels = preprocessed(&f32_tower, &imgs);
    let refs: Vec<&[f32]> = pixels.iter().map(Vec::as_slice).collect();
    let (a, b) = (encode(&f32_tower, &refs), encode(&f16_tower, &refs));
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "F16 and F32 files differ"
    );
    assert!(
        f16_tower.weight_bytes() == f32_tower.weight_bytes(),
        "both hold f32 panels"
    );
}

#[test]
fn an_image_is_the_same_bits_alone_or_in_a_batch_on_every_tier() {
    let imgs = images(&reference());
    let tiers = KernelTier::available();
    eprintln!("kernel tiers on this CPU: {tiers:?}");
    for file in ["mmproj-f32.gguf", "mmproj-q8_0.gguf"] {
        let Some(path) = model(file) else {
            return;
        };
        let mut first: Option<(KernelTier, Vec<Vec<f32>>)> = None;
        for &tier in &tiers {
            sluice_kernels::cpu::limit_kernels(tier);
            let tower = VisionTower::open(&path).unwrap();
            let pixels = preprocessed(&tower, &imgs);
            let alone: Vec<Vec<f32>> = pixels.iter().map(|p| encode(&tower, &[p])).collect();
            let together = encode(&tower, &[&pixels[0], &pixels[1], &pixels[2]]);
            let reordered = encode(&tower, &[&pixels[2], &pixels[0], &pixels[1], &pixels[0]]);
            let n = alone[0].len();
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            for (i, img) in imgs.iter().enumerate() {
                let what = format!("{file} on {tier:?} kernels, {}", img.name);
                assert!(
                    same(&alone[i], &together[i * n..][..n]),
                    "{what}: alone vs 3 together"
                );
            }
            for (slot, i) in [2, 0, 1, 0].into_iter().enumerate() {
                let what = format!("{file} on {tier:?} kernels, {}", imgs[i].name);
                assert!(
                    same(&alone[i], &reordered[slot * n..][..n]),
                    "{what}: in slot {slot}"
                );
            }
            match &first {
                None => first = Some((tier, alone)),
                Some((t0, want)) => {
                    for (i, img) in imgs.iter().enumerate() {
                        let what = format!("{file}, {}", img.name);
                        assert!(
                            same(&want[i], &alone[i]),
                            "{what}: {tier:?} differs from {t0:?}"
                        );
                    }
                }
            }
        }
        sluice_kernels::cpu::limit_kernels(*tiers.last().expect("one tier at least"));
        eprintln!("{file}: invariant on {} tier(s)", tiers.len());
    }
}

/// The Q8_0 file against the F32 file's reference: its matrices are those values rounded to
/// Q8_0, and its products round the activations to int8 per 32 (llama.cpp's arithmetic for
/// the format), so it agrees within [`Q8_0_TOLERANCE`], not [`F32_TOLERANCE`].
#[test]
fn the_q8_0_file_is_close_to_the_reference() {
    let Some(tower) = open("mmproj-q8_0.gguf") else {
        return;
    };
    let imgs = images(&reference());
    let pixels = preprocessed(&tower, &imgs);
    let refs: Vec<&[f32]> = pixels.iter().map(Vec::as_slice).collect();
    let got = encode(&tower, &refs);
    let per_image = got.len() / imgs.len();
    for (img, got) in imgs.iter().zip(got.chunks_exact(per_image)) {
        let worst = got
            .iter()
            .zip(&img.embeddings)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "mmproj-q8_0.gguf {}: largest difference from the F32 reference {worst:.2e}",
            img.name
        );
        assert!(
            worst <= Q8_0_TOLERANCE,
            "{}: {worst} from the reference",
            img.name
        );
    }
}

#[test]
fn different_images_give_different_embeddings() {
    let reference = reference();
    let imgs = images(&reference);
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        let diff: f32 = imgs[a]
            .embeddings
            .iter()
            .zip(&imgs[b].embeddings)
            .map(|(x, y)| (x - y).abs())
            .sum::<f32>()
            / imgs[a].embeddings.len() as f32;
        assert!(
            diff > 0.1,
            "{} and {}: mean difference {diff}",
            imgs[a].name,
            imgs[b].name
        );
    }
}

#[test]
fn bad_input_sizes_are_errors() {
    let Some(tower) = open("mmproj-f32.gguf") else {
        return;
    };
    let pixels = vec![0f32; tower.spec().pixels_per_image()];
    let mut out = vec![0f32; 5];
    let err = tower.encode(&[&pixels], &mut out).unwrap_err().to_string();
    assert!(err.contains("the output holds 5"), "{err}");
    let short = vec![0f32; 7];
    let err = tower.encode(&[&short], &mut out).unwrap_err().to_string();
    assert!(err.contains("image 0 has 7 values"), "{err}");
}

// ---- bad files, written here ----

type Metadata = Vec<(String, Value)>;
type Tensors = Vec<(String, QTensor)>;

/// A small valid `gemma3` projector: hidden 32, 2 heads, MLP 64, one layer, 28x28 pixels in
/// patches of 14, merged 2x2 into one token of 16.
fn small_mmproj() -> (Metadata, Tensors) {
    mmproj_of(&Shape {
        hidden: 32,
        heads: 2,
        ff: 64,
        layers: 1,
        image: 28,
        merge: 2,
        width: 16,
    })
}

/// The shape of a written projector (patches of 14).
struct Shape {
    hidden: usize,
    heads: u32,
    ff: usize,
    layers: usize,
    image: usize,
    merge: u32,
    width: usize,
}

/// A `gemma3` projector of `shape` with small pseudo-random weights.
fn mmproj_of(shape: &Shape) -> (Metadata, Tensors) {
    let &Shape {
        hidden: h,
        heads,
        ff,
        layers,
        image,
        merge,
        width,
    } = shape;
    let u = Value::U32;
    let meta = vec![
        ("general.architecture".into(), Value::String("clip".into())),
        ("clip.has_vision_encoder".into(), Value::Bool(true)),
        ("clip.projector_type".into(), Value::String("gemma3".into())),
        ("clip.use_gelu".into(), Value::Bool(true)),
        ("clip.vision.projection_dim".into(), u(width as u32)),
        ("clip.vision.image_size".into(), u(image as u32)),
        ("clip.vision.patch_size".into(), u(14)),
        ("clip.vision.embedding_length".into(), u(h as u32)),
        ("clip.vision.feed_forward_length".into(), u(ff as u32)),
        ("clip.vision.block_count".into(), u(layers as u32)),
        ("clip.vision.attention.head_count".into(), u(heads)),
        (
            "clip.vision.attention.layer_norm_epsilon".into(),
            Value::F32(1e-6),
        ),
        (
            "clip.vision.image_mean".into(),
            Value::Array(vec![Value::F32(0.5); 3]),
        ),
        (
            "clip.vision.image_std".into(),
            Value::Array(vec![Value::F32(0.5); 3]),
        ),
        ("clip.vision.projector.scale_factor".into(), u(merge)),
    ];
    let mut seed = 1u64;
    let mut tensor = |dims: &[usize]| {
        let n: usize = dims.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect();
        let t = Tensor::from_vec(values, dims, &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::F32).unwrap()
    };
    let patches = (image / 14) * (image / 14);
    let mut tensors = vec![
        ("v.patch_embd.weight".to_string(), tensor(&[h, 3, 14, 14])),
        ("v.patch_embd.bias".into(), tensor(&[h])),
        ("v.position_embd.weight".into(), tensor(&[patches, h])),
    ];
    for i in 0..layers {
        for t in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            tensors.push((format!("v.blk.{i}.{t}.weight"), tensor(&[h, h])));
            tensors.push((format!("v.blk.{i}.{t}.bias"), tensor(&[h])));
        }
        for t in ["ln1", "ln2"] {
            tensors.push((format!("v.blk.{i}.{t}.weight"), tensor(&[h])));
            tensors.push((format!("v.blk.{i}.{t}.bias"), tensor(&[h])));
        }
        tensors.push((format!("v.blk.{i}.ffn_up.weight"), tensor(&[ff, h])));
        tensors.push((format!("v.blk.{i}.ffn_up.bias"), tensor(&[ff])));
        tensors.push((format!("v.blk.{i}.ffn_down.weight"), tensor(&[h, ff])));
        tensors.push((format!("v.blk.{i}.ffn_down.bias"), tensor(&[h])));
    }
    tensors.push(("v.post_ln.weight".into(), tensor(&[h])));
    tensors.push(("v.post_ln.bias".into(), tensor(&[h])));
    tensors.push(("mm.soft_emb_norm.weight".into(), tensor(&[h])));
    tensors.push(("mm.input_projection.weight".into(), tensor(&[h, width])));
    (meta, tensors)
}

fn write(path: &Path, meta: &[(String, Value)], tensors: &[(String, QTensor)]) {
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &meta, &tensors).unwrap();
}

/// The error opening the small projector after `edit`.
fn open_edited(
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>),
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj.gguf");
    let (mut meta, mut tensors) = small_mmproj();
    edit(&mut meta, &mut tensors);
    write(&path, &meta, &tensors);
    match VisionTower::open(&path) {
        Ok(_) => "opened".to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_small_projector_opens_and_encodes() {
    if !sluice_kernels::cpu::gemm::available() {
        let err = open_edited(|_, _| {});
        assert!(err.contains("AVX2"), "{err}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj.gguf");
    let (meta, tensors) = small_mmproj();
    write(&path, &meta, &tensors);
    let tower = VisionTower::open(&path).unwrap();
    assert_eq!(tower.spec().tokens_per_image, 1);
    assert_eq!(tower.spec().embedding_width, 16);
    let pixels = vec![0.25f32; tower.spec().pixels_per_image()];
    let out = encode(&tower, &[&pixels]);
    assert!(out.iter().all(|v| v.is_finite()) && out.iter().any(|v| *v != 0.0));
}

#[test]
fn a_missing_tensor_is_named() {
    let err = open_edited(|_, t| t.retain(|(name, _)| name != "v.blk.0.attn_k.weight"));
    assert!(
        err.contains("tensor `v.blk.0.attn_k.weight` is missing"),
        "{err}"
    );
}

#[test]
fn a_wrong_shape_is_named() {
    let err = open_edited(|_, t| {
        let wrong = QTensor::quantize(
            &Tensor::zeros((5, 32), candle_core::DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap();
        t.iter_mut()
            .find(|(name, _)| name == "v.position_embd.weight")
            .unwrap()
            .1 = wrong;
    });
    assert!(
        err.contains("tensor `v.position_embd.weight` has shape [5, 32], expected [4, 32]"),
        "{err}"
    );
}

#[test]
fn an_unknown_projector_type_is_named() {
    let err = open_edited(|m, _| {
        m.iter_mut()
            .find(|(k, _)| k == "clip.projector_type")
            .unwrap()
            .1 = Value::String("qwen2vl_merger".into());
    });
    assert!(
        err.contains("projector type `qwen2vl_merger` is not supported (supported: gemma3)"),
        "{err}"
    );
}

#[test]
fn a_missing_key_is_named() {
    let err = open_edited(|m, _| m.retain(|(k, _)| k != "clip.vision.patch_size"));
    assert!(
        err.contains("metadata `clip.vision.patch_size` is missing"),
        "{err}"
    );
    let err = open_edited(|m, _| m.retain(|(k, _)| k != "clip.projector_type"));
    assert!(
        err.contains("metadata `clip.projector_type` is missing"),
        "{err}"
    );
}

#[test]
fn a_projection_that_does_not_match_projection_dim_is_named() {
    let err = open_edited(|m, _| {
        m.iter_mut()
            .find(|(k, _)| k == "clip.vision.projection_dim")
            .unwrap()
            .1 = Value::U32(24);
    });
    assert!(
        err.contains(
            "`clip.vision.projection_dim`: 24, but `mm.input_projection.weight` projects to 16"
        ),
        "{err}"
    );
}

/// The text model the lead's loader pairs the tower with: its hidden size is the tower's
/// embedding width (llama.cpp refuses a pair that differs).
#[test]
fn the_tiny_pair_agrees_on_the_width() {
    let (Some(text), Some(tower)) = (model("text-f32.gguf"), open("mmproj-f32.gguf")) else {
        return;
    };
    let mut file = sluice_model::GgufFile::open(&text).unwrap();
    let config = file.model_config().unwrap();
    assert_eq!(config.hidden_size, tower.spec().embedding_width);
}

/// The token layout `tests/fixtures/vision/README.md` writes down, on llama.cpp's own rows of
/// `chat-greedy.jsonl`: one BOS, each text piece between media markers tokenized on its own,
/// and per image `<start_of_image>`, `tokens_per_image` positions, `<end_of_image>` give
/// exactly the prompt token count llama-server reported.
#[test]
fn llama_cpps_image_prompts_have_the_documented_layout() {
    let Some(text) = model("text-f32.gguf") else {
        return;
    };
    let tokenizer = sluice_model::GgufFile::open(&text)
        .unwrap()
        .tokenizer()
        .unwrap();
    let tokens_per_image = reference()["tokens_per_image"].as_u64().unwrap() as usize;
    let rows = std::fs::read_to_string(fixtures().join("chat-greedy.jsonl")).unwrap();
    let (soi, eoi) = (
        tokenizer.encode("<start_of_image>").unwrap(),
        tokenizer.encode("<end_of_image>").unwrap(),
    );
    assert_eq!(
        (soi.as_slice(), eoi.as_slice()),
        (&[255999u32][..], &[256000u32][..])
    );
    for line in rows.lines() {
        let row: Json = serde_json::from_str(line).unwrap();
        let prompt = row["prompt"].as_str().unwrap();
        let pieces: Vec<&str> = prompt.split("<__media__>").collect();
        let mut count = 1; // BOS
        for piece in &pieces {
            count += tokenizer.encode(piece).unwrap().len();
        }
        count += (pieces.len() - 1) * (tokens_per_image + 2);
        let name = row["name"].as_str().unwrap();
        assert_eq!(
            count as u64,
            row["prompt_tokens"].as_u64().unwrap(),
            "{name}: {prompt:?}"
        );
    }
}

/// The time to encode images on Gemma 3's real tower shape (SigLIP so400m at 896 pixels: 4096
/// patches of 1152, 16 heads, MLP 4304, into 256 tokens of 2560) with `VISION_BENCH_LAYERS`
/// layers (default 1; the real tower has 27) and `VISION_BENCH_IMAGES` images (default 1).
/// Not a check: `cargo test --release -p sluice-model --test vision -- --ignored --nocapture`.
#[test]
#[ignore]
fn time_a_real_size_tower() {
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (layers, images) = (var("VISION_BENCH_LAYERS", 1), var("VISION_BENCH_IMAGES", 1));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj.gguf");
    let (meta, tensors) = mmproj_of(&Shape {
        hidden: 1152,
        heads: 16,
        ff: 4304,
        layers,
        image: 896,
        merge: 4,
        width: 2560,
    });
    write(&path, &meta, &tensors);
    let t0 = std::time::Instant::now();
    let tower = VisionTower::open(&path).unwrap();
    let opened = t0.elapsed();
    let pixels = vec![0.1f32; tower.spec().pixels_per_image()];
    let all: Vec<&[f32]> = (0..images).map(|_| pixels.as_slice()).collect();
    let t1 = std::time::Instant::now();
    let out = encode(&tower, &all);
    let took = t1.elapsed();
    assert!(out.iter().all(|v| v.is_finite()));
    eprintln!(
        "{layers} layer(s), {images} image(s) of {} tokens: opened in {opened:.2?}, encoded in {took:.2?} on {} threads",
        tower.spec().tokens_per_image,
        rayon::current_num_threads()
    );
}

#[test]
fn a_text_model_given_as_the_projector_is_named() {
    let Some(text) = model("text-f32.gguf") else {
        return;
    };
    let err = VisionTower::open(&text).err().expect("refused").to_string();
    assert!(
        err.contains("`general.architecture` is `gemma3`, a projector's"),
        "{err}"
    );
}

/// `PagedLlama::attach_vision` pairs the tower with the text model it feeds and refuses the
/// others, naming why: a text model of another family, or of another width.
#[test]
fn a_tower_pairs_only_with_the_text_model_it_feeds() {
    let (Some(mmproj), Some(text)) = (model("mmproj-f32.gguf"), model("text-f32.gguf")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let paged = |path: &Path| {
        let m =
            sluice_model::LlamaModel::load(path, &sluice_model::LoadOptions::default()).unwrap();
        sluice_model::PagedLlama::new(m, 8, 16).unwrap()
    };
    let attach = |path: &Path| {
        let tower = VisionTower::open(&mmproj).unwrap();
        paged(path).attach_vision(tower, &mmproj).map(|_| ())
    };
    attach(&text).expect("the pair it was made for");
    let others = [
        (
            "llama",
            sluice_model::Architecture::Llama,
            64,
            "reads no images",
        ),
        (
            "gemma3-wide",
            sluice_model::Architecture::Gemma3,
            128,
            "does not match",
        ),
    ];
    for (name, architecture, hidden_size, says) in others {
        let path = dir.path().join(format!("{name}.gguf"));
        sluice_model::testing::TinyModelSpec {
            architecture,
            hidden_size,
            ..Default::default()
        }
        .write_gguf(&path)
        .unwrap();
        let err = attach(&path).unwrap_err().to_string();
        assert!(err.contains(says), "{name}: {err}");
    }
}
