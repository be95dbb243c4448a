//! What the tokenizer reads from a GGUF file's header, without depending on a GGUF reader: the
//! model crate implements [`GgufMetadata`] for its file type, and [`MetadataMap`] holds
//! metadata built in memory (tests, tiny vocabularies).

use std::collections::HashMap;

/// Typed access to GGUF metadata. Each accessor is `Ok(None)` when the key is absent and
/// `Err(reason)` when it is present with another type (the reason says what was found).
/// Integers of every GGUF width come back as `i64`; floats of either width, and integer arrays
/// (llama.cpp reads SentencePiece scores from either), as `f32`.
pub trait GgufMetadata {
    fn string(&self, key: &str) -> Result<Option<&str>, String>;
    fn boolean(&self, key: &str) -> Result<Option<bool>, String>;
    fn integer(&self, key: &str) -> Result<Option<i64>, String>;
    fn strings(&self, key: &str) -> Result<Option<Vec<&str>>, String>;
    fn integers(&self, key: &str) -> Result<Option<Vec<i64>>, String>;
    fn floats(&self, key: &str) -> Result<Option<Vec<f32>>, String>;
}

/// One metadata value held in memory.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    String(String),
    Bool(bool),
    Int(i64),
    Float(f64),
    Array(Vec<MetadataValue>),
}

impl MetadataValue {
    /// An array of strings.
    pub fn strings<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Self {
        Self::Array(items.into_iter().map(|s| Self::String(s.into())).collect())
    }

    /// An array of floats.
    pub fn floats(items: impl IntoIterator<Item = f32>) -> Self {
        Self::Array(items.into_iter().map(|f| Self::Float(f.into())).collect())
    }

    /// An array of integers.
    pub fn ints<I: Into<i64>>(items: impl IntoIterator<Item = I>) -> Self {
        Self::Array(items.into_iter().map(|i| Self::Int(i.into())).collect())
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::String(_) => "string",
            Self::Bool(_) => "bool",
            Self::Int(_) => "integer",
            Self::Float(_) => "float",
            Self::Array(_) => "array",
        }
    }
}

/// GGUF metadata built in memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetadataMap(HashMap<String, MetadataValue>);

impl MetadataMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, key: impl Into<String>, value: MetadataValue) {
        self.0.insert(key.into(), value);
    }

    pub fn remove(&mut self, key: &str) -> Option<MetadataValue> {
        self.0.remove(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut MetadataValue> {
        self.0.get_mut(key)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        read: impl Fn(&'a MetadataValue) -> Option<T>,
    ) -> Result<Option<T>, String> {
        match self.0.get(key) {
            None => Ok(None),
            Some(value) => read(value)
                .map(Some)
                .ok_or_else(|| format!("expected {expected}, found a {}", value.kind())),
        }
    }

    fn array<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        read: impl Fn(&'a MetadataValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>, String> {
        let Some(items) = self.typed(key, "an array", |v| match v {
            MetadataValue::Array(items) => Some(items),
            _ => None,
        })?
        else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                read(item)
                    .ok_or_else(|| format!("element {i} is a {}, not {expected}", item.kind()))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

impl GgufMetadata for MetadataMap {
    fn string(&self, key: &str) -> Result<Option<&str>, String> {
        self.typed(key, "a string", |v| match v {
            MetadataValue::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, String> {
        self.typed(key, "a bool", |v| match v {
            MetadataValue::Bool(b) => Some(*b),
            _ => None,
        })
    }

    fn integer(&self, key: &str) -> Result<Option<i64>, String> {
        self.typed(key, "an integer", |v| match v {
            MetadataValue::Int(i) => Some(*i),
            _ => None,
        })
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&str>>, String> {
        self.array(key, "a string", |v| match v {
            MetadataValue::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    fn integers(&self, key: &str) -> Result<Option<Vec<i64>>, String> {
        self.array(key, "an integer", |v| match v {
            MetadataValue::Int(i) => Some(*i),
            _ => None,
        })
    }

    fn floats(&self, key: &str) -> Result<Option<Vec<f32>>, String> {
        self.array(key, "a number", |v| match v {
            MetadataValue::Float(f) => Some(*f as f32),
            MetadataValue::Int(i) => Some(*i as f32),
            _ => None,
        })
    }
}
