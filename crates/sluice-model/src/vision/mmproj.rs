//! A projector GGUF file (llama.cpp's `--mmproj`): its `clip.*` keys into the tower's
//! configuration and [`VisionSpec`], and its tensors, checked by name and shape, into the
//! forms the tower multiplies by. The key and tensor names are llama.cpp's
//! (tools/mtmd/clip-impl.h), as its converter writes them.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::{Device, Tensor};

use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::gguf_keys::int_value;
use crate::weights::{GgufMatrix, Linear, LinearOptions, WeightsKind};

/// What can go wrong opening a projector file or encoding images with it. Loading errors name
/// the file and the key or tensor: the person reading them usually holds the wrong file.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// The file cannot be read as GGUF (or a weight cannot be laid out for the kernels).
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}: metadata `{key}` is missing (is this a projector file from llama.cpp's converter, `--mmproj`?)")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata `{key}`: {reason}")]
    BadKey {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: projector type `{found}` is not supported (supported: {})", supported_projectors().join(", "))]
    UnknownProjector { path: PathBuf, found: String },
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: unsupported {what}")]
    Unsupported { path: PathBuf, what: String },
    /// Pixels or an output buffer that do not fit the tower (a caller's mistake, not a file's).
    #[error("invalid vision input: {0}")]
    InvalidInput(String),
}

pub type Result<T, E = VisionError> = std::result::Result<T, E>;

/// The projector that turns the encoder's patches into the text model's embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectorKind {
    /// Gemma 3: SigLIP, its patch grid average-pooled in squares of `scale_factor`, RMSNorm
    /// and one projection (`mm.soft_emb_norm`, `mm.input_projection`).
    Gemma3,
}

impl ProjectorKind {
    /// The name in `clip.projector_type`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gemma3 => "gemma3",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Gemma3].into_iter().find(|k| k.name() == name)
    }
}

fn supported_projectors() -> Vec<&'static str> {
    vec![ProjectorKind::Gemma3.name()]
}

/// What the rest of the server needs to know of a tower: the input it takes and the
/// embeddings it gives.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionSpec {
    pub projector: ProjectorKind,
    /// The square every image is resized to, in pixels a side.
    pub image_size: usize,
    pub patch_size: usize,
    /// Embeddings an image becomes: the positions it takes in the text model's sequence.
    pub tokens_per_image: usize,
    /// Each embedding's width; it must equal the text model's hidden size (the caller's check:
    /// llama.cpp refuses the pair otherwise).
    pub embedding_width: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
}

impl VisionSpec {
    /// f32 values of one preprocessed image: `image_size` squared pixels of RGB, interleaved.
    pub fn pixels_per_image(&self) -> usize {
        self.image_size * self.image_size * 3
    }
}

/// The encoder's hyper-parameters, as llama.cpp's loader reads them for a SigLIP tower.
#[derive(Debug, Clone)]
pub(crate) struct TowerConfig {
    pub spec: VisionSpec,
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub ff: usize,
    pub layers: usize,
    /// The LayerNorms' epsilon, and the projector's RMSNorm's.
    pub eps: f32,
    /// Patches a side of the pooling squares (`clip.vision.projector.scale_factor`).
    pub merge: usize,
}

impl TowerConfig {
    /// Patches a side of an image.
    pub fn side(&self) -> usize {
        self.spec.image_size / self.spec.patch_size
    }

    pub fn patches(&self) -> usize {
        self.side() * self.side()
    }
}

/// llama.cpp's caps (clip.cpp's sanity checks): larger values overflow its patch counts.
const MAX_IMAGE_SIZE: usize = 8192;
const MAX_MERGE: usize = 65535;

/// An opened projector file: the GGUF file, and the reading of its keys and tensors.
pub(crate) struct MmprojFile {
    pub file: GgufFile,
}

impl MmprojFile {
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self {
            file: GgufFile::open(path)?,
        })
    }

    fn path(&self) -> PathBuf {
        self.file.path.clone()
    }

    fn bad(&self, key: &str, reason: impl Into<String>) -> VisionError {
        VisionError::BadKey {
            path: self.path(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    fn value(&self, key: &str) -> Option<&Value> {
        self.file.metadata().get(key)
    }

    fn required(&self, key: &str) -> Result<&Value> {
        self.value(key).ok_or_else(|| VisionError::MissingKey {
            path: self.path(),
            key: key.to_string(),
        })
    }

    fn usize_of(&self, key: &str, v: &Value) -> Result<usize> {
        let i = int_value(v)
            .ok_or_else(|| self.bad(key, format!("expected an integer, found {v:?}")))?;
        usize::try_from(i).map_err(|_| self.bad(key, format!("{i} is negative")))
    }

    fn get_usize(&self, key: &str) -> Result<usize> {
        self.usize_of(key, self.required(key)?)
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.value(key).map(|v| self.usize_of(key, v)).transpose()
    }

    fn positive(&self, key: &str) -> Result<usize> {
        match self.get_usize(key)? {
            0 => Err(self.bad(key, "must be positive")),
            n => Ok(n),
        }
    }

    fn get_f32(&self, key: &str) -> Result<f32> {
        match self.required(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            other => Err(self.bad(key, format!("expected a float, found {other:?}"))),
        }
    }

    fn get_bool(&self, key: &str) -> Result<bool> {
        match self.value(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.bad(key, format!("expected a bool, found {other:?}"))),
        }
    }

    fn get_string(&self, key: &str) -> Result<Option<&str>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.bad(key, format!("expected a string, found {other:?}"))),
        }
    }

    /// The first three floats of an array (llama.cpp reads three, one a channel).
    fn rgb(&self, key: &str) -> Result<[f32; 3]> {
        let Value::Array(items) = self.required(key)? else {
            return Err(self.bad(key, "expected an array of floats"));
        };
        if items.len() < 3 {
            return Err(self.bad(key, format!("{} values, expected 3 (R, G, B)", items.len())));
        }
        let mut out = [0f32; 3];
        for (o, item) in out.iter_mut().zip(items) {
            *o = match item {
                Value::F32(x) => *x,
                Value::F64(x) => *x as f32,
                other => return Err(self.bad(key, format!("expected floats, found {other:?}"))),
            };
        }
        Ok(out)
    }

    /// The tower's configuration from the keys, each checked; the embedding width from
    /// `mm.input_projection.weight`'s columns, as llama.cpp takes it.
    pub fn config(&self) -> Result<TowerConfig> {
        // A text model handed over as the projector: say so, rather than name a missing key.
        if let Some(arch) = self.get_string("general.architecture")? {
            if arch != "clip" {
                return Err(VisionError::Unsupported {
                    path: self.path(),
                    what: format!(
                        "file for a vision tower: `general.architecture` is `{arch}`, a \
                         projector's (llama.cpp's `--mmproj` file) is `clip`"
                    ),
                });
            }
        }
        if !self.get_bool("clip.has_vision_encoder")? {
            return Err(VisionError::Unsupported {
                path: self.path(),
                what: "projector without a vision encoder (`clip.has_vision_encoder` is not true)"
                    .into(),
            });
        }
        let kind_key = if self.value("clip.projector_type").is_some() {
            "clip.projector_type"
        } else {
            "clip.vision.projector_type"
        };
        let name = self
            .get_string(kind_key)?
            .ok_or_else(|| VisionError::MissingKey {
                path: self.path(),
                key: "clip.projector_type".into(),
            })?;
        let projector =
            ProjectorKind::from_name(name).ok_or_else(|| VisionError::UnknownProjector {
                path: self.path(),
                found: name.to_string(),
            })?;
        if !self.get_bool("clip.use_gelu")? || self.get_bool("clip.use_silu")? {
            // Without `use_gelu`, llama.cpp's encoder MLP is GELU-quick (or SiLU): not what a
            // SigLIP file holds, and not computed here.
            return Err(VisionError::Unsupported {
                path: self.path(),
                what: "encoder MLP activation: only GELU (`clip.use_gelu` true) is computed".into(),
            });
        }
        let hidden = self.positive("clip.vision.embedding_length")?;
        let heads = self.positive("clip.vision.attention.head_count")?;
        let head_dim = match self.opt_usize("clip.vision.attention.head_dim")? {
            Some(0) | None => hidden / heads,
            Some(d) => d,
        };
        if head_dim == 0
            || (self.value("clip.vision.attention.head_dim").is_none() && hidden % heads != 0)
        {
            return Err(self.bad(
                "clip.vision.attention.head_count",
                format!("{heads} heads do not divide the hidden size {hidden}"),
            ));
        }
        if let Some(kv) = self.opt_usize("clip.vision.attention.head_count_kv")? {
            if kv != heads {
                return Err(VisionError::Unsupported {
                    path: self.path(),
                    what: format!("grouped attention in the encoder ({heads} heads over {kv})"),
                });
            }
        }
        let image_size = self.positive("clip.vision.image_size")?;
        let patch_size = self.positive("clip.vision.patch_size")?;
        if image_size > MAX_IMAGE_SIZE {
            return Err(self.bad(
                "clip.vision.image_size",
                format!("{image_size} is over {MAX_IMAGE_SIZE}"),
            ));
        }
        if image_size % patch_size != 0 {
            return Err(self.bad(
                "clip.vision.patch_size",
                format!("{patch_size} does not divide the image size {image_size}"),
            ));
        }
        // Gemma 3's default (every size of the family); test models write their own.
        let merge = self
            .opt_usize("clip.vision.projector.scale_factor")?
            .unwrap_or(4);
        let side = image_size / patch_size;
        if merge == 0 || merge > MAX_MERGE || side % merge != 0 {
            return Err(self.bad(
                "clip.vision.projector.scale_factor",
                format!("{merge} does not divide the {side} patches a side"),
            ));
        }
        let eps = self.get_f32("clip.vision.attention.layer_norm_epsilon")?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(self.bad("clip.vision.attention.layer_norm_epsilon", format!("{eps}")));
        }
        let projection_dim = self.get_usize("clip.vision.projection_dim")?;
        let embedding_width = self.projection_width(hidden)?;
        if projection_dim != embedding_width {
            return Err(self.bad(
                "clip.vision.projection_dim",
                format!("{projection_dim}, but `{INPUT_PROJECTION}` projects to {embedding_width}"),
            ));
        }
        let image_std = self.rgb("clip.vision.image_std")?;
        if image_std.iter().any(|s| !(s.is_finite() && *s != 0.0)) {
            return Err(self.bad(
                "clip.vision.image_std",
                format!("{image_std:?}: each must be finite and not 0"),
            ));
        }
        Ok(TowerConfig {
            spec: VisionSpec {
                projector,
                image_size,
                patch_size,
                tokens_per_image: (side / merge) * (side / merge),
                embedding_width,
                image_mean: self.rgb("clip.vision.image_mean")?,
                image_std,
            },
            hidden,
            heads,
            head_dim,
            ff: self.positive("clip.vision.feed_forward_length")?,
            layers: self.positive("clip.vision.block_count")?,
            eps,
            merge,
        })
    }

    /// The text width `mm.input_projection.weight` ([vision hidden, text hidden]) projects to.
    fn projection_width(&self, hidden: usize) -> Result<usize> {
        let dims = self.dims(INPUT_PROJECTION)?;
        match dims.as_slice() {
            [rows, cols] if *rows == hidden && *cols > 0 => Ok(*cols),
            _ => Err(VisionError::TensorShape {
                path: self.path(),
                name: INPUT_PROJECTION.into(),
                found: dims.clone(),
                expected: vec![hidden, dims.last().copied().unwrap_or(0)],
            }),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.has_tensor(name)
    }

    /// Tensor `name`'s shape, rows first (numpy's order, the reverse of ggml's `ne`).
    pub fn dims(&self, name: &str) -> Result<Vec<usize>> {
        self.file
            .content
            .tensor_infos
            .get(name)
            .map(|info| info.shape.dims().to_vec())
            .ok_or_else(|| VisionError::MissingTensor {
                path: self.path(),
                name: name.to_string(),
            })
    }

    fn check_dims(&self, name: &str, expected: &[usize]) -> Result<()> {
        let found = self.dims(name)?;
        if found == expected {
            Ok(())
        } else {
            Err(VisionError::TensorShape {
                path: self.path(),
                name: name.to_string(),
                found,
                expected: expected.to_vec(),
            })
        }
    }

    /// Tensor `name` of shape `expected` as f32 values.
    pub fn values(&mut self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        self.check_dims(name, expected)?;
        let t = self
            .file
            .tensor(name, &Device::Cpu)?
            .dequantize(&Device::Cpu)
            .map_err(ModelError::from)?;
        Ok(t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(ModelError::from)?)
    }

    /// A vector of `len`, or `None` where the file has none (an optional bias).
    pub fn opt_vector(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if !self.has(name) {
            return Ok(None);
        }
        self.values(name, &[len]).map(Some)
    }

    pub fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.values(name, &[len])
    }

    /// Matrices stacked along their rows into one linear layer: each `(name, shape)` a tensor
    /// of `shape` (rows first; dimensions past the first are its columns, as a convolution's
    /// kernel is read), all of the same columns, in the file's format on our kernels
    /// (`WeightsKind::Auto`: f32/f16 as f32 panels, the quantized formats on the int8 kernels in
    /// llama.cpp's arithmetic). `bias`: each part's optional bias, zeros where one is absent.
    pub fn linear(
        &mut self,
        parts: &[(&str, &[usize])],
        biases: &[Option<Vec<f32>>],
    ) -> Result<Linear> {
        let mut tensors = Vec::with_capacity(parts.len());
        for &(name, shape) in parts {
            self.check_dims(name, shape)?;
            tensors.push((name, self.file.tensor(name, &Device::Cpu)?));
        }
        let mut datas = Vec::with_capacity(parts.len());
        for (name, q) in &tensors {
            datas.push((*name, q.dtype(), q.data().map_err(ModelError::from)?));
        }
        let matrices: Vec<GgufMatrix<'_>> = datas
            .iter()
            .zip(parts)
            .map(|((name, dtype, data), (_, shape))| {
                GgufMatrix::new(name, *dtype, shape[0], shape[1..].iter().product(), data)
            })
            .collect();
        let bias = if biases.iter().any(Option::is_some) {
            let mut all = Vec::new();
            for (b, (_, shape)) in biases.iter().zip(parts) {
                match b {
                    Some(b) => all.extend_from_slice(b),
                    None => all.resize(all.len() + shape[0], 0.0),
                }
            }
            let n = all.len();
            Some(Tensor::from_vec(all, n, &Device::Cpu).map_err(ModelError::from)?)
        } else {
            None
        };
        Ok(Linear::from_gguf(&matrices, bias, &options())?)
    }

    /// Tensor `name` of `shape` (rows first; the rest its columns) as a linear layer whose
    /// weights are rounded to f16 (f32 panels of f16 values), with `bias`: the patch
    /// convolution as llama.cpp computes it. `ggml_conv_2d` writes its `im2col` in f16 and the
    /// CPU's f16 matmul converts the other operand, the kernel, to f16 too, summing in f32;
    /// so the kernel's f32 values are rounded here, once, and the patches where they are
    /// gathered. Measured on the tiny projector (scripts/vision-oracle.py): without both
    /// roundings the embeddings stood up to 8.7e-4 from llama.cpp's (mean 1.8e-4; values of
    /// rms 0.85), with them 6.2e-4 (mean 1.0e-4). Most of the rest is llama.cpp's CPU GELU,
    /// a table of f16 inputs and outputs, which this tower does not copy (computing GELU in
    /// f32 as the text models' GeGLU does); with that table too the numpy reference came
    /// within 8e-5.
    pub fn f16_linear(
        &mut self,
        name: &str,
        shape: &[usize],
        bias: Option<Vec<f32>>,
    ) -> Result<Linear> {
        let values = self.values(name, shape)?;
        let rounded: Vec<f32> = values
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        let cols = shape[1..].iter().product::<usize>();
        let w =
            Tensor::from_vec(rounded, (shape[0], cols), &Device::Cpu).map_err(ModelError::from)?;
        let bias = bias
            .map(|b| Tensor::from_vec(b, shape[0], &Device::Cpu))
            .transpose()
            .map_err(ModelError::from)?;
        Ok(Linear::from_tensor(w, bias, &options())?)
    }

    /// Matrix `name` of shape `[rows, cols]` multiplied transposed (`x W`, as llama.cpp
    /// multiplies `mm.input_projection`): its f32 values turned to `[cols, rows]` f32 panels.
    pub fn transposed_linear(&mut self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        self.check_dims(name, &[rows, cols])?;
        let w = self
            .file
            .tensor(name, &Device::Cpu)?
            .dequantize(&Device::Cpu)
            .and_then(|w| w.t()?.contiguous())
            .map_err(ModelError::from)?;
        Ok(Linear::from_tensor(w, None, &options())?)
    }
}

pub(crate) const INPUT_PROJECTION: &str = "mm.input_projection.weight";

/// Every matrix of the tower on our CPU kernels in its file's format.
fn options() -> LinearOptions {
    LinearOptions {
        kind: WeightsKind::Auto,
        device: Device::Cpu,
        amx_min_rows: None,
    }
}
