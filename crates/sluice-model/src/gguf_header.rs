//! A scan of a GGUF header's tensor infos that needs no knowledge of tensor types: to name the
//! tensor whose type sluice cannot read (candle's header reader stops at such a type with only
//! its number), and to read a header whose tensors include MXFP4 (type 39, which candle 0.11
//! does not know) by handing candle a copy with those types patched.

use std::io::{BufReader, Read};
use std::path::Path;

/// GGML type ids candle reads (F32 .. Q8_K, BF16).
const KNOWN_TYPES: &[u32] = &[0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];

/// GGML's id of MXFP4 (gpt-oss's experts).
pub(crate) const MXFP4_TYPE: u32 = 39;

/// One tensor's entry in a GGUF header: its name and type id, and where its row length (its
/// first dimension: GGUF lists them innermost first) and its type id lie in the header's bytes.
struct Entry {
    name: String,
    kind: u32,
    row_length_at: usize,
    type_at: usize,
}

/// The header of the GGUF file at `path`, read without knowing any tensor type: its bytes (up
/// to the end of the tensor entries) and its tensor entries in order; `None` when it cannot be
/// scanned.
fn read_header(path: &Path) -> Option<(Vec<u8>, Vec<Entry>)> {
    let mut r = Recording {
        inner: BufReader::new(std::fs::File::open(path).ok()?),
        bytes: Vec::new(),
    };
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic).ok()?;
    if &magic != b"GGUF" || u32_of(&mut r)? < 2 {
        return None;
    }
    let tensors = u64_of(&mut r)?;
    let kvs = u64_of(&mut r)?;
    for _ in 0..kvs {
        skip_string(&mut r)?;
        let kind = u32_of(&mut r)?;
        skip_value(&mut r, kind, 0)?;
    }
    let mut entries = Vec::new();
    for _ in 0..tensors {
        let name = string(&mut r)?;
        let dims = u32_of(&mut r)?;
        let row_length_at = r.bytes.len();
        for _ in 0..dims {
            u64_of(&mut r)?;
        }
        let type_at = r.bytes.len();
        let kind = u32_of(&mut r)?;
        u64_of(&mut r)?;
        entries.push(Entry {
            name,
            kind,
            row_length_at,
            type_at,
        });
    }
    Some((r.bytes, entries))
}

/// A reader that keeps a copy of every byte read through it.
struct Recording<R> {
    inner: R,
    bytes: Vec<u8>,
}

impl<R: Read> Read for Recording<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// The first tensor of the file at `path` whose GGML type id is not one candle reads, with
/// that id; `None` when there is none or the header cannot be scanned.
pub(crate) fn unknown_tensor_type(path: &Path) -> Option<(String, u32)> {
    let (_, entries) = read_header(path)?;
    entries
        .into_iter()
        .find(|e| !KNOWN_TYPES.contains(&e.kind))
        .map(|e| (e.name, e.kind))
}

/// A header whose MXFP4 tensors' type ids are replaced by F32's (0), so that candle parses it;
/// the names of those tensors, whose sizes the caller computes as MXFP4's. `None` when the file
/// has no MXFP4 tensor, another type candle does not know, or a header that cannot be scanned.
pub(crate) fn with_mxfp4_patched(path: &Path) -> Option<(Vec<u8>, Vec<String>)> {
    let (mut bytes, entries) = read_header(path)?;
    let mut names = Vec::new();
    for e in entries {
        if e.kind == MXFP4_TYPE {
            bytes[e.type_at..e.type_at + 4].copy_from_slice(&0u32.to_le_bytes());
            names.push(e.name);
        } else if !KNOWN_TYPES.contains(&e.kind) {
            return None;
        }
    }
    (!names.is_empty()).then_some((bytes, names))
}

/// Rewrites, in place, the header of the GGUF file at `path` so that each tensor of `tensors`
/// (name, row length) is MXFP4 with rows of that length: its type id becomes 39 and its row
/// length the given one. The writer stored each as F16 of the same bytes (`row * 17 / 64`
/// values a row), so no offset moves.
pub(crate) fn patch_to_mxfp4(path: &Path, tensors: &[(String, u64)]) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let (_, entries) = read_header(path).ok_or_else(|| bad("not a readable GGUF header"))?;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    for (name, cols) in tensors {
        let e = entries
            .iter()
            .find(|e| e.name == *name)
            .ok_or_else(|| bad("a tensor to patch is not in the header"))?;
        f.seek(SeekFrom::Start(e.row_length_at as u64))?;
        f.write_all(&cols.to_le_bytes())?;
        f.seek(SeekFrom::Start(e.type_at as u64))?;
        f.write_all(&MXFP4_TYPE.to_le_bytes())?;
    }
    Ok(())
}

fn u32_of(r: &mut impl Read) -> Option<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

fn u64_of(r: &mut impl Read) -> Option<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn skip(r: &mut impl Read, n: u64) -> Option<()> {
    (std::io::copy(&mut r.take(n), &mut std::io::sink()).ok()? == n).then_some(())
}

fn skip_string(r: &mut impl Read) -> Option<()> {
    let n = u64_of(r)?;
    skip(r, n)
}

fn string(r: &mut impl Read) -> Option<String> {
    let n = u64_of(r)?;
    // A tensor name is short; a huge length means a corrupt header.
    if n > 1 << 16 {
        return None;
    }
    let mut b = vec![0u8; n as usize];
    r.read_exact(&mut b).ok()?;
    String::from_utf8(b).ok()
}

/// Skips one metadata value of GGUF value type `kind` (arrays nest at most a few deep).
fn skip_value(r: &mut impl Read, kind: u32, depth: usize) -> Option<()> {
    match kind {
        0 | 1 | 7 => skip(r, 1),
        2 | 3 => skip(r, 2),
        4..=6 => skip(r, 4),
        10..=12 => skip(r, 8),
        8 => skip_string(r),
        9 if depth < 4 => {
            let inner = u32_of(r)?;
            let n = u64_of(r)?;
            for _ in 0..n {
                skip_value(r, inner, depth + 1)?;
            }
            Some(())
        }
        _ => None,
    }
}
