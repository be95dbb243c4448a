//! A model on disk in either format sluice serves, opened by path: [`ModelSource`] picks the
//! reader ([`crate::gguf`] for a file, [`crate::hf`] for a directory) and loads the model and
//! tokenizer through it.

use std::path::Path;

use sluice_tokenizer::Tokenizer;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfModelDir;
use crate::load::LoadOptions;
use crate::model::LlamaModel;

/// A model on disk, in either format sluice serves.
pub enum ModelSource {
    /// A GGUF file: weights, hyper-parameters and tokenizer in one file.
    Gguf(GgufFile),
    /// A Hugging Face directory: `config.json`, `tokenizer.json` (+ `tokenizer_config.json`,
    /// `generation_config.json`), `model.safetensors` or shards with an index.
    /// Boxed: its parsed config is several times the GGUF handle's size.
    Hf(Box<HfModelDir>),
}

impl ModelSource {
    /// A directory opens as a Hugging Face checkpoint, anything else as a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            Ok(Self::Hf(Box::new(HfModelDir::open(path)?)))
        } else {
            Ok(Self::Gguf(GgufFile::open(path)?))
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Gguf(f) => &f.path,
            Self::Hf(d) => d.dir(),
        }
    }

    /// `"gguf"` or `"hf"`, for logs.
    pub fn format(&self) -> &'static str {
        match self {
            Self::Gguf(_) => "gguf",
            Self::Hf(_) => "hf",
        }
    }

    pub fn model_config(&mut self) -> Result<ModelConfig> {
        match self {
            Self::Gguf(f) => f.model_config(),
            Self::Hf(d) => Ok(d.config().clone()),
        }
    }

    /// The model's tokenizer, special ids and chat template.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            Self::Gguf(f) => f.tokenizer(),
            Self::Hf(d) => d.tokenizer(),
        }
    }

    pub fn load_model(&mut self, options: &LoadOptions) -> Result<LlamaModel> {
        match self {
            Self::Gguf(f) => LlamaModel::from_gguf(f, options),
            Self::Hf(d) => LlamaModel::from_hf(d, options),
        }
    }
}

impl LlamaModel {
    /// Loads a GGUF file, or a Hugging Face directory (see [`ModelSource`]).
    pub fn load(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Self> {
        ModelSource::open(path)?.load_model(options)
    }
}
