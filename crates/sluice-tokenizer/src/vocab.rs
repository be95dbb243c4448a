//! The vocabulary as decoding sees it: per id, its text, its kind and the raw bytes it stands
//! for, in one flat table built once at load.

use crate::byte_level::ByteLevelAlphabet;

/// What a vocabulary entry is, for decoding and for skipping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// A piece of text spelled in the vocabulary's piece encoding (byte-level, sentencepiece).
    Normal,
    /// A control token (`<|im_start|>`, BOS/EOS, UNK): decodes to its literal text, is parsed
    /// as one id in input text, and is dropped when decoding with `skip_special_tokens`.
    Special,
    /// A user-defined added token: parsed as one id and decoded as its literal text, but it is
    /// content, so `skip_special_tokens` keeps it (as Hugging Face and llama.cpp do).
    Literal,
}

/// How a vocabulary spells the bytes of normal tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceEncoding {
    /// GPT-2 byte-level BPE: every byte is one printable character (`Ġ` is a space).
    ByteLevel,
    /// SentencePiece style: `▁` is a space and `<0xAB>` pieces stand for one raw byte.
    SentencePiece,
}

/// Per-id facts decoding needs on the hot path: the raw bytes each id stands for (one flat
/// buffer with offsets, not 49k small allocations), its vocabulary text, and its kind.
pub(crate) struct TokenTable {
    pub(crate) texts: Vec<Option<String>>,
    bytes: Vec<u8>,
    /// `bytes[offsets[id]..offsets[id + 1]]` are the bytes of `id`.
    offsets: Vec<u32>,
    kinds: Vec<TokenKind>,
}

impl TokenTable {
    /// `entries[id]` is the vocabulary text and kind of `id`; `None` marks a hole in the id
    /// space (possible in a `tokenizer.json`), which decodes to nothing.
    pub(crate) fn new(entries: Vec<(Option<String>, TokenKind)>, encoding: PieceEncoding) -> Self {
        let alphabet = ByteLevelAlphabet::new();
        Self::with_bytes(entries, |_, text, kind, bytes| match (kind, encoding) {
            (TokenKind::Special | TokenKind::Literal, _) => {
                bytes.extend_from_slice(text.as_bytes())
            }
            (TokenKind::Normal, PieceEncoding::ByteLevel) => alphabet.decode_into(text, bytes),
            (TokenKind::Normal, PieceEncoding::SentencePiece) => sentencepiece_bytes(text, bytes),
        })
    }

    /// Like [`new`](Self::new), with each id's bytes written by `write(id, text, kind, out)`:
    /// for vocabularies whose bytes depend on more than the text and the kind (a GGUF
    /// SentencePiece vocabulary's token types: unused tokens decode to nothing, byte tokens
    /// to their byte).
    pub(crate) fn with_bytes(
        entries: Vec<(Option<String>, TokenKind)>,
        mut write: impl FnMut(usize, &str, TokenKind, &mut Vec<u8>),
    ) -> Self {
        let mut bytes = Vec::with_capacity(entries.len() * 6);
        let mut offsets = Vec::with_capacity(entries.len() + 1);
        let mut texts = Vec::with_capacity(entries.len());
        let mut kinds = Vec::with_capacity(entries.len());
        offsets.push(0);
        for (id, (text, kind)) in entries.into_iter().enumerate() {
            if let Some(text) = &text {
                write(id, text, kind, &mut bytes);
            }
            // Vocabularies are far below 4 GiB of text; saturate rather than wrap if not.
            offsets.push(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
            texts.push(text);
            kinds.push(kind);
        }
        Self {
            texts,
            bytes,
            offsets,
            kinds,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.kinds.len()
    }

    pub(crate) fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The bytes of `id`; empty for an id outside the table.
    pub(crate) fn bytes_of(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&start), Some(&end)) => {
                self.bytes.get(start as usize..end as usize).unwrap_or(&[])
            }
            _ => &[],
        }
    }
}

/// The bytes of one SentencePiece piece: `<0xAB>` is the byte 0xAB, `▁` is a space.
fn sentencepiece_bytes(piece: &str, out: &mut Vec<u8>) {
    if let Some(hex) = piece
        .strip_prefix("<0x")
        .and_then(|rest| rest.strip_suffix('>'))
    {
        if hex.len() == 2 {
            if let Ok(byte) = u8::from_str_radix(hex, 16) {
                out.push(byte);
                return;
            }
        }
    }
    for (i, part) in piece.split('\u{2581}').enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(part.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentencepiece_pieces_map_spaces_and_byte_tokens() {
        let mut out = Vec::new();
        sentencepiece_bytes("\u{2581}hello", &mut out);
        sentencepiece_bytes("<0x0A>", &mut out);
        sentencepiece_bytes("<0xZZ>", &mut out);
        assert_eq!(out, b" hello\n<0xZZ>");
    }
}
