//! What the vocabulary tests share: a GGUF header reader (the tokenizer crate has no GGUF
//! reader of its own, and depending on the model crate's would be a cycle), where llama.cpp's
//! vocab files are, and llama.cpp's test-case format.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use sluice_tokenizer::{MetadataMap, MetadataValue};

/// The metadata of a GGUF file's header: every key, tensors not read.
pub fn read_gguf_metadata(path: &Path) -> MetadataMap {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = Reader { data: &data, at: 0 };
    assert_eq!(r.take(4), b"GGUF", "{}: not a GGUF file", path.display());
    let version = r.u32();
    assert!(version >= 2, "{}: GGUF version {version}", path.display());
    let _tensors = r.u64();
    let keys = r.u64();
    let mut metadata = MetadataMap::new();
    for _ in 0..keys {
        let key = r.string();
        let kind = r.u32();
        let value = r.value(kind);
        metadata.insert(key, value);
    }
    metadata
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let bytes = &self.data[self.at..self.at + n];
        self.at += n;
        bytes
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        self.take(N).try_into().unwrap()
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8(self.take(n).to_vec()).expect("GGUF strings are UTF-8")
    }

    /// One value of GGUF type `kind`.
    fn value(&mut self, kind: u32) -> MetadataValue {
        use MetadataValue as V;
        match kind {
            0 => V::Int(self.take(1)[0].into()),
            1 => V::Int(i8::from_le_bytes(self.array()).into()),
            2 => V::Int(u16::from_le_bytes(self.array()).into()),
            3 => V::Int(i16::from_le_bytes(self.array()).into()),
            4 => V::Int(self.u32().into()),
            5 => V::Int(i32::from_le_bytes(self.array()).into()),
            6 => V::Float(f32::from_le_bytes(self.array()).into()),
            7 => V::Bool(self.take(1)[0] != 0),
            8 => V::String(self.string()),
            9 => {
                let item = self.u32();
                let n = self.u64();
                V::Array((0..n).map(|_| self.value(item)).collect())
            }
            10 => V::Int(self.u64() as i64),
            11 => V::Int(i64::from_le_bytes(self.array())),
            12 => V::Float(f64::from_le_bytes(self.array())),
            other => panic!("unknown GGUF value type {other}"),
        }
    }
}

/// `tests/fixtures/tokenizer/<name>` at the workspace root (files kept in the repository).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer")
        .join(name)
}

/// `models/<name>` at the workspace root, fetched by `scripts/fetch-vocab-fixtures.sh`, or
/// `None` after printing that the test skipped (under `CI=true` a missing file fails instead):
/// [`sluice_tokenizer::testing::optional_input`] for this script.
pub fn optional_vocab(name: &str) -> Option<PathBuf> {
    sluice_tokenizer::testing::optional_input(name, "scripts/fetch-vocab-fixtures.sh")
}

/// llama.cpp's tokenizer test cases (`tests/test-tokenizer-0.cpp`): inputs separated by a line
/// `__ggml_vocab_test__` (each input ends with the newline before it), and one line of
/// space-separated expected ids per input. In file order; llama.cpp's own runner keys them by
/// input, which only drops duplicates.
pub fn read_cases(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(inp).unwrap_or_else(|e| panic!("{}: {e}", inp.display()));
    let expected =
        std::fs::read_to_string(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = raw.as_str();
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(i) => {
                inputs.push(rest[..i].to_string());
                rest = &rest[i + SEP.len()..];
            }
            None => {
                inputs.push(rest.to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = expected
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|id| id.parse().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{} against {}",
        inp.display(),
        out.display()
    );
    inputs.into_iter().zip(outputs).collect()
}
