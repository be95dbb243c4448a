//! A GGUF file's metadata read by key, typed, with errors naming the file and the key: what
//! `GgufFile` reads its own keys with, and what a family reads its
//! `{arch}.*` keys with (`Family::gguf_params`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use crate::error::{ModelError, Result};

/// A GGUF file's metadata, with `arch` the prefix of its `{arch}.*` keys.
#[derive(Clone, Copy)]
pub(crate) struct GgufKeys<'a> {
    path: &'a Path,
    metadata: &'a HashMap<String, Value>,
    arch: &'a str,
}

impl<'a> GgufKeys<'a> {
    pub(crate) fn new(path: &'a Path, metadata: &'a HashMap<String, Value>, arch: &'a str) -> Self {
        Self {
            path,
            metadata,
            arch,
        }
    }

    /// `{arch}.{k}`.
    pub(crate) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// The `{arch}` prefix: the family's GGUF name as the file spells it.
    pub(crate) fn arch(&self) -> &str {
        self.arch
    }

    pub(crate) fn metadata(&self) -> &'a HashMap<String, Value> {
        self.metadata
    }

    pub(crate) fn err(&self, key: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(&self, what: String) -> ModelError {
        ModelError::Unsupported {
            path: self.path.to_path_buf(),
            what,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Result<&'a Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| self.err(key, "not present"))
    }

    pub(crate) fn get_string(&self, key: &str) -> Result<&'a str> {
        let v = self.get(key)?;
        v.to_string()
            .map(|s| s.as_str())
            .map_err(|e| self.err(key, e.to_string()))
    }

    /// Integer metadata of any width, as GGUF writers disagree on u32 vs u64 vs i32.
    pub(crate) fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        let n = match *v {
            // Wider than i64 can hold, and so than any size.
            Value::U64(x) if x > i64::MAX as u64 => {
                return Err(self.err(key, format!("{x} is out of range")))
            }
            ref other => int_value(other)
                .ok_or_else(|| self.err(key, format!("expected an integer, found {other:?}")))?,
        };
        usize::try_from(n).map_err(|_| self.err(key, format!("{n} is out of range")))
    }

    pub(crate) fn get_f32(&self, key: &str) -> Result<f32> {
        match self.get(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            other => Err(self.err(key, format!("expected a float, found {other:?}"))),
        }
    }

    /// `f` of the key where the file has it.
    pub(crate) fn opt<T>(
        &self,
        key: &str,
        f: impl Fn(&Self, &str) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.metadata.contains_key(key) {
            f(self, key).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// An integer value of any width.
pub(crate) fn int_value(value: &Value) -> Option<i64> {
    Some(match *value {
        Value::U8(v) => v.into(),
        Value::I8(v) => v.into(),
        Value::U16(v) => v.into(),
        Value::I16(v) => v.into(),
        Value::U32(v) => v.into(),
        Value::I32(v) => v.into(),
        Value::U64(v) => i64::try_from(v).ok()?,
        Value::I64(v) => v,
        _ => return None,
    })
}
