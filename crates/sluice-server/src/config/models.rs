//! `model`, the one key that is a list: the models a server serves, each a path or hub name
//! and, from a `[[model]]` table, its own name, weights and KV memory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_model::WeightsKind;

use super::{ByteSize, LoraModules, Named, DEFAULT_MODEL};

/// `model`: one path (the flag's and the file's form), several (the flag repeated, or a list in
/// the file), or `[[model]]` tables in the file, each with its own settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPaths(pub Vec<ModelEntry>);

/// One served model: its path or hub name and, from a `[[model]]` table, what it sets apart
/// from the server's keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    pub model: PathBuf,
    /// Its served name [default: the file's stem, the directory's or the hub name].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// Its `weights` [default: the server's].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Named<WeightsKind>>,
    /// Its KV cache's memory [default: the server's `kv_cache_memory`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_memory: Option<ByteSize>,
    /// LoRA adapters served beside it, `NAME=PATH` comma-separated (for the default model,
    /// beside `lora_modules`') [default: none].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_modules: Option<LoraModules>,
    /// Its vision tower, a projector GGUF (for the default model, in place of `mmproj`')
    /// [default: none].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<PathBuf>,
}

impl ModelEntry {
    fn path(model: PathBuf) -> Self {
        Self {
            model,
            served_model_name: None,
            weights: None,
            kv_cache_memory: None,
            lora_modules: None,
            mmproj: None,
        }
    }

    fn is_plain(&self) -> bool {
        self.served_model_name.is_none()
            && self.weights.is_none()
            && self.kv_cache_memory.is_none()
            && self.lora_modules.is_none()
            && self.mmproj.is_none()
    }

    /// The adapters its table lists.
    pub fn adapters(&self) -> &[(String, PathBuf)] {
        self.lora_modules.as_ref().map_or(&[], |m| m.0.as_slice())
    }
}

impl ModelPaths {
    pub fn paths(paths: Vec<PathBuf>) -> Self {
        Self(paths.into_iter().map(ModelEntry::path).collect())
    }

    /// The default model.
    pub fn first(&self) -> &Path {
        self.0
            .first()
            .map_or(Path::new(DEFAULT_MODEL), |e| e.model.as_path())
    }
}

impl Serialize for ModelPaths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !self.0.iter().all(ModelEntry::is_plain) {
            return self.0.serialize(s);
        }
        let paths: Vec<&PathBuf> = self.0.iter().map(|e| &e.model).collect();
        match paths.as_slice() {
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ModelPaths {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Item {
            Path(PathBuf),
            Table(ModelEntry),
        }
        // A list first: serde would otherwise read a list of two paths as one table's fields
        // by position.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            Many(Vec<Item>),
            One(Item),
        }
        let item = |i| match i {
            Item::Path(p) => ModelEntry::path(p),
            Item::Table(t) => t,
        };
        Ok(Self(match OneOrMany::deserialize(d)? {
            OneOrMany::One(i) => vec![item(i)],
            OneOrMany::Many(v) => v.into_iter().map(item).collect(),
        }))
    }
}

/// What one served model is loaded with: [`Config::models`].
#[derive(Clone, Debug, PartialEq)]
pub struct ModelChoice {
    pub path: PathBuf,
    pub name: String,
    pub weights: WeightsKind,
    pub kv_cache_memory: ByteSize,
    /// Its LoRA adapters, `(name, path)`.
    pub lora_modules: Vec<(String, PathBuf)>,
    /// Its vision tower (`mmproj`).
    pub mmproj: Option<PathBuf>,
}
