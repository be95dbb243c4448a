//! Streaming detokenization: turns generated ids into text one id at a time without ever
//! emitting half a UTF-8 character. Byte-level vocabularies split multi-byte characters (emoji,
//! CJK) across several tokens, so a token's bytes may end mid-character; those trailing bytes
//! are held until the character completes.
//!
//! The result is defined to equal [`Tokenizer::decode`] of all ids pushed: everything pushed and
//! then [`IncrementalDecoder::finish`] concatenate to exactly that string, U+FFFD placement
//! included.

use crate::tokenizer::Tokenizer;

/// Per-sequence decoding state. Runs once per generated token, so it keeps its two small
/// buffers and reuses them instead of allocating per token.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    skip_special_tokens: bool,
    /// Bytes of an unfinished UTF-8 character (at most 3).
    pending: Vec<u8>,
    /// Text completed by the last `push`, returned by reference.
    out: String,
}

impl IncrementalDecoder {
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            skip_special_tokens,
            pending: Vec::with_capacity(8),
            out: String::with_capacity(32),
        }
    }

    /// Feeds one generated id; returns the text it completes (possibly empty, possibly text
    /// that earlier ids started). Special tokens are dropped when skipping them, and then they
    /// do not interrupt a character that straddles them, exactly as in `decode`.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> &str {
        self.out.clear();
        if self.skip_special_tokens && tok.is_special(id) {
            return &self.out;
        }
        let bytes = tok.token_bytes(id);
        if self.pending.is_empty() {
            // The common case: no held bytes, decode straight from the token's bytes.
            let used = decode_complete(bytes, &mut self.out);
            self.pending.extend_from_slice(&bytes[used..]);
        } else {
            self.pending.extend_from_slice(bytes);
            let used = decode_complete(&self.pending, &mut self.out);
            self.pending.drain(..used);
        }
        &self.out
    }

    /// Ends the stream: whatever bytes are still held cannot complete any more, so they become
    /// U+FFFD (one per invalid sequence, as `String::from_utf8_lossy` does). Leaves the decoder
    /// empty and ready for reuse.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Whether bytes of an unfinished character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// Appends the text of `bytes` to `out`, replacing each invalid sequence with U+FFFD, except an
/// incomplete character at the very end, which more bytes could still finish. Returns how many
/// bytes were consumed; the rest (at most 3) must be retried with the bytes that follow.
///
/// Uses the same chunking as `String::from_utf8_lossy`, whose decisions at a character boundary
/// depend only on the bytes from there on, so decoding in pieces gives the same text as
/// decoding everything at once.
fn decode_complete(bytes: &[u8], out: &mut String) -> usize {
    let mut chunks = bytes.utf8_chunks().peekable();
    while let Some(chunk) = chunks.next() {
        out.push_str(chunk.valid());
        let invalid = chunk.invalid();
        if invalid.is_empty() {
            continue;
        }
        if chunks.peek().is_none() && is_truncated_char(invalid) {
            return bytes.len() - invalid.len();
        }
        out.push(char::REPLACEMENT_CHARACTER);
    }
    bytes.len()
}

/// Whether `bytes` is the beginning of a valid UTF-8 character that is merely cut short.
fn is_truncated_char(bytes: &[u8]) -> bool {
    matches!(std::str::from_utf8(bytes), Err(e) if e.error_len().is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::tiny_metadata;

    fn tiny_tokenizer() -> Tokenizer {
        Tokenizer::from_gguf(&tiny_metadata("gpt-2"), std::path::Path::new("tiny.gguf")).unwrap()
    }

    /// Id of the single-byte token for `byte` in the tiny vocabulary (bytes start at id 3).
    fn byte_id(byte: u8) -> u32 {
        3 + byte as u32
    }

    fn stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<String>, String) {
        let mut dec = IncrementalDecoder::new(skip);
        let mut pieces: Vec<String> = ids
            .iter()
            .map(|&id| dec.push(tok, id).to_string())
            .collect();
        pieces.push(dec.finish());
        let all = pieces.concat();
        (pieces, all)
    }

    #[test]
    fn multibyte_characters_are_held_until_complete() {
        let tok = tiny_tokenizer();
        // "🦀" is F0 9F A6 80, "é" is C3 A9: one byte token each.
        let ids: Vec<u32> = "a🦀é".bytes().map(byte_id).collect();
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(pieces, vec!["a", "", "", "", "🦀", "", "é", ""]);
        assert_eq!(all, "a🦀é");
        assert_eq!(all, tok.decode(&ids, false));
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let tok = tiny_tokenizer();
        // A lone continuation byte, a start byte followed by ASCII, a truncated tail.
        let bytes = [b'x', 0x80, 0xE2, b'y', 0xF0, 0x9F];
        let ids: Vec<u32> = bytes.iter().map(|&b| byte_id(b)).collect();
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(
            pieces,
            vec!["x", "\u{FFFD}", "", "\u{FFFD}y", "", "", "\u{FFFD}"]
        );
        assert_eq!(all, tok.decode(&ids, false));
    }

    #[test]
    fn special_tokens_are_literal_or_skipped() {
        let tok = tiny_tokenizer();
        // <|im_start|>, then "é" split around <|im_end|>.
        let ids = [1, byte_id(0xC3), 2, byte_id(0xA9)];
        let (_, kept) = stream(&tok, &ids, false);
        assert_eq!(kept, tok.decode(&ids, false));
        assert_eq!(kept, "<|im_start|>\u{FFFD}<|im_end|>\u{FFFD}");
        let (_, skipped) = stream(&tok, &ids, true);
        assert_eq!(skipped, "é");
        assert_eq!(skipped, tok.decode(&ids, true));
    }

    #[test]
    fn random_byte_streams_match_decode() {
        let tok = tiny_tokenizer();
        // A fixed LCG keeps the test deterministic; bias towards high bytes to hit many
        // partial and invalid sequences.
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..200 {
            let ids: Vec<u32> = (0..24)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let r = (state >> 33) as u32;
                    match r % 10 {
                        0 => r % 3,                           // special
                        1 => 259 + r % 3,                     // merged ASCII
                        2 => byte_id(b'a'),                   // ASCII
                        _ => byte_id(0x80 + (r % 128) as u8), // high byte
                    }
                })
                .collect();
            for skip in [false, true] {
                let (_, all) = stream(&tok, &ids, skip);
                assert_eq!(all, tok.decode(&ids, skip), "ids {ids:?} skip {skip}");
            }
        }
    }

    #[test]
    fn finish_resets_for_reuse() {
        let tok = tiny_tokenizer();
        let mut dec = IncrementalDecoder::new(false);
        assert_eq!(dec.push(&tok, byte_id(0xE4)), "");
        assert!(dec.has_pending());
        assert_eq!(dec.finish(), "\u{FFFD}");
        assert!(!dec.has_pending());
        assert_eq!(dec.push(&tok, byte_id(b'z')), "z");
    }
}
