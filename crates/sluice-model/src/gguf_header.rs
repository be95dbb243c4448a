//! A scan of a GGUF header's tensor infos that needs no knowledge of tensor types, to name the
//! tensor whose type sluice cannot read: candle's header reader stops at such a type with only
//! its number.

use std::io::{BufReader, Read};
use std::path::Path;

/// GGML type ids candle reads (F32 .. Q8_K, BF16).
const KNOWN_TYPES: &[u32] = &[0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];

/// The first tensor of the file at `path` whose GGML type id is not one candle reads, with
/// that id; `None` when there is none or the header cannot be scanned.
pub(crate) fn unknown_tensor_type(path: &Path) -> Option<(String, u32)> {
    let mut r = BufReader::new(std::fs::File::open(path).ok()?);
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic).ok()?;
    if &magic != b"GGUF" {
        return None;
    }
    let version = u32_of(&mut r)?;
    if version < 2 {
        return None;
    }
    let tensors = u64_of(&mut r)?;
    let kvs = u64_of(&mut r)?;
    for _ in 0..kvs {
        skip_string(&mut r)?;
        let kind = u32_of(&mut r)?;
        skip_value(&mut r, kind, 0)?;
    }
    for _ in 0..tensors {
        let name = string(&mut r)?;
        let dims = u32_of(&mut r)?;
        for _ in 0..dims {
            u64_of(&mut r)?;
        }
        let kind = u32_of(&mut r)?;
        u64_of(&mut r)?;
        if !KNOWN_TYPES.contains(&kind) {
            return Some((name, kind));
        }
    }
    None
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
