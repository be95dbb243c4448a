//! SentencePiece encoding for GGUF vocabularies (`tokenizer.ggml.model = "llama"`), computing
//! exactly what llama.cpp's `llm_tokenizer_spm` computes, so that a prompt is the same ids here
//! and there:
//!
//! 1. The text is cut around special tokens (control, unknown and user-defined ones) the way
//!    llama.cpp's `tokenizer_st_partition` cuts it: one token at a time, longest text first,
//!    each splitting every text fragment at its leftmost non-overlapping occurrences. This is
//!    not leftmost-longest matching: with `XY` and `YZW` both special, `XYZW` is `X`, `YZW`.
//! 2. Each text fragment that starts the input or follows a special token gets a space in
//!    front (`add_space_prefix`), and every space becomes `▁` (U+2581).
//! 3. The fragment starts as one symbol per character. Adjacent symbols whose concatenation is
//!    a vocabulary piece are candidates; the candidate whose piece has the highest score is
//!    merged first, the leftmost among equal scores, until no candidate is left.
//! 4. Each final symbol is its piece's id; a character the vocabulary lacks becomes its UTF-8
//!    bytes as byte tokens (`<0xE4>`), or one unknown id when the vocabulary lacks byte tokens.
//!
//! Nothing is normalized besides: llama.cpp ignores `remove_extra_whitespaces` for these
//! vocabularies, and so do we.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ahash::AHashMap;
use aho_corasick::{AhoCorasick, MatchKind};

/// A space as SentencePiece spells it.
pub(crate) const ESCAPED_SPACE: char = '\u{2581}';

/// Marks the absence of a neighbour in a fragment's linked list of symbols.
const NONE: u32 = u32::MAX;

/// A token cut out of the text before the merges run: a control, unknown or user-defined one.
#[derive(Debug, Clone)]
pub(crate) struct SpecialToken {
    pub(crate) id: u32,
    pub(crate) text: String,
    /// Whitespace before an occurrence is dropped with it (llama.cpp's `LSTRIP` attribute).
    pub(crate) lstrip: bool,
    /// Whitespace after an occurrence is dropped with it (`RSTRIP`; Phi-3 sets it).
    pub(crate) rstrip: bool,
}

/// A run of the text, after the special tokens are cut out: either text to merge (a byte
/// range of the input) or one special token's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// One symbol of a fragment being merged: a byte range of the escaped text, linked to its
/// neighbours. A merge grows the left symbol over the right one and empties the right one.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// A merge candidate: adjacent symbols `left` and `right` whose concatenation (`size` bytes)
/// is a piece with `score`.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl Ord for Bigram {
    /// The heap's top is the highest score, and among equal scores the leftmost pair:
    /// llama.cpp's `llm_bigram_spm::comparator`. Scores are never NaN or -0.0 (the vocabulary
    /// canonicalizes them), so `total_cmp` orders them as llama.cpp's `<` does.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Working memory for one `encode` call, reused across its fragments.
#[derive(Default)]
struct Scratch {
    /// The fragment with its space prefix and every space escaped.
    escaped: String,
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
}

pub(crate) struct SentencePiece {
    /// Every token's text, whatever its type (llama.cpp's `token_to_id`: control tokens'
    /// texts can be merged into too). A repeated text keeps its last id, as there.
    pieces: AHashMap<Box<str>, u32>,
    /// `scores[id]`: higher merges first.
    scores: Vec<f32>,
    /// The token each byte falls back to, for characters the vocabulary lacks.
    byte_fallback: [Option<u32>; 256],
    /// What a character becomes when some of its bytes have no token either.
    unk: Option<u32>,
    add_space_prefix: bool,
    /// In llama.cpp's order: longest text first, then lowest id.
    specials: Vec<SpecialToken>,
    /// Every special text, pattern `i` being `specials[i]`: tells which specials occur at all,
    /// so text without any (the common case) skips the partition.
    special_finder: Option<AhoCorasick>,
}

impl SentencePiece {
    /// `tokens[id]` is each id's text, `scores[id]` its score; `byte_fallback[b]` the id byte
    /// `b` falls back to, `unk` the id of a character some byte of which has none; `specials`
    /// the tokens cut out of text before merging. Fails with a reason when the special tokens
    /// cannot be indexed.
    pub(crate) fn new(
        tokens: &[&str],
        scores: &[f32],
        byte_fallback: [Option<u32>; 256],
        unk: Option<u32>,
        add_space_prefix: bool,
        mut specials: Vec<SpecialToken>,
    ) -> Result<Self, String> {
        let mut pieces = AHashMap::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            // An empty piece can never match a symbol (llama.cpp renames it `[EMPTY_<id>]`).
            if !token.is_empty() {
                pieces.insert(Box::from(*token), id as u32);
            }
        }
        // -0.0 and 0.0 tie in llama.cpp's comparison but not in `total_cmp`; NaN never
        // wins a comparison there, like the lowest score here.
        let scores = scores
            .iter()
            .map(|&s| {
                if s.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    s + 0.0
                }
            })
            .collect();
        specials.retain(|s| !s.text.is_empty());
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let special_finder = if specials.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::Standard)
                    .build(specials.iter().map(|s| s.text.as_str()))
                    .map_err(|e| format!("cannot index the special tokens: {e}"))?,
            )
        };
        Ok(Self {
            pieces,
            scores,
            byte_fallback,
            unk,
            add_space_prefix,
            specials,
            special_finder,
        })
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.pieces.get(token).copied()
    }

    /// The ids of `text`, special tokens in it parsed as single ids (llama.cpp's
    /// `parse_special`, which the byte-level BPE path always does too), no BOS added.
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        // About one token per 3-4 bytes of English; a guess that avoids most regrowth.
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut scratch = Scratch::default();
        match self.partition(text) {
            None => {
                if !text.is_empty() {
                    self.encode_fragment(text, self.add_space_prefix, &mut out, &mut scratch);
                }
            }
            Some(fragments) => {
                // The first fragment counts as following a special token: llama.cpp prefixes
                // the start of the input and every text right after a special token.
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(start, end) => {
                            let prefix = self.add_space_prefix && after_special;
                            self.encode_fragment(&text[start..end], prefix, &mut out, &mut scratch);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        out
    }

    /// `text` cut around the special tokens it holds, or `None` when it holds none.
    fn partition(&self, text: &str) -> Option<Vec<Fragment>> {
        let finder = self.special_finder.as_ref()?;
        // An overlapping search finds every occurrence of every special, so a special it does
        // not report occurs in no fragment either and can be left out of the passes below.
        let mut present: Vec<usize> = finder
            .find_overlapping_iter(text)
            .map(|m| m.pattern().as_usize())
            .collect();
        if present.is_empty() {
            return None;
        }
        present.sort_unstable();
        present.dedup();

        let bytes = text.as_bytes();
        let mut fragments = vec![Fragment::Text(0, text.len())];
        let mut next = Vec::new();
        for special in present.iter().map(|&i| &self.specials[i]) {
            next.clear();
            for &fragment in &fragments {
                let Fragment::Text(mut start, end) = fragment else {
                    next.push(fragment);
                    continue;
                };
                // Each occurrence, leftmost first, splits the rest of the fragment.
                loop {
                    let Some(found) = text[start..end].find(special.text.as_str()) else {
                        next.push(Fragment::Text(start, end));
                        break;
                    };
                    let at = start + found;
                    let mut left_end = at;
                    if special.lstrip {
                        while left_end > start && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(special.id));
                    let mut right = at + special.text.len();
                    if special.rstrip {
                        while right < end && is_c_space(bytes[right]) {
                            right += 1;
                        }
                    }
                    if right >= end {
                        break;
                    }
                    start = right;
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        Some(fragments)
    }

    /// Appends the ids of one text fragment (no special tokens in it).
    fn encode_fragment(&self, text: &str, prefix: bool, out: &mut Vec<u32>, s: &mut Scratch) {
        let escaped = &mut s.escaped;
        escaped.clear();
        if prefix {
            escaped.push(ESCAPED_SPACE);
        }
        let mut rest = text;
        while let Some(i) = rest.find(' ') {
            escaped.push_str(&rest[..i]);
            escaped.push(ESCAPED_SPACE);
            rest = &rest[i + 1..];
        }
        escaped.push_str(rest);

        let symbols = &mut s.symbols;
        symbols.clear();
        for (i, (start, c)) in escaped.char_indices().enumerate() {
            let i = i as u32;
            symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: if i == 0 { NONE } else { i - 1 },
                next: i + 1,
            });
        }
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = NONE;

        let heap = &mut s.heap;
        heap.clear();
        for left in 1..symbols.len() as u32 {
            self.push_bigram(escaped, symbols, heap, left - 1, left);
        }
        while let Some(bigram) = heap.pop() {
            let l = symbols[bigram.left as usize];
            let r = symbols[bigram.right as usize];
            // Stale when either side has been merged away or has grown since: symbols only
            // grow, so an unchanged total size means the same two symbols, still adjacent.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            symbols[bigram.left as usize].len += r.len;
            symbols[bigram.left as usize].next = r.next;
            symbols[bigram.right as usize].len = 0;
            if r.next != NONE {
                symbols[r.next as usize].prev = bigram.left;
            }
            self.push_bigram(escaped, symbols, heap, l.prev, bigram.left);
            self.push_bigram(escaped, symbols, heap, bigram.left, r.next);
        }

        // Symbol 0 always survives: a merge keeps its left symbol.
        let mut i = 0;
        while i != NONE {
            let sym = symbols[i as usize];
            let piece = &escaped[sym.start as usize..(sym.start + sym.len) as usize];
            match self.pieces.get(piece) {
                Some(&id) => out.push(id),
                // Only a single character can be missing: every merge made a piece. (So
                // llama.cpp's `rev_merge` re-segmentation, keyed by merged texts, never applies.)
                None => {
                    if piece
                        .bytes()
                        .all(|b| self.byte_fallback[b as usize].is_some())
                    {
                        out.extend(piece.bytes().filter_map(|b| self.byte_fallback[b as usize]));
                    } else if let Some(unk) = self.unk {
                        // Where llama.cpp would throw: one unknown id for the character, as
                        // SentencePiece itself gives.
                        out.push(unk);
                    }
                }
            }
            i = sym.next;
        }
    }

    /// Queues the merge of `left` and `right` if their concatenation is a piece.
    fn push_bigram(
        &self,
        escaped: &str,
        symbols: &[Symbol],
        heap: &mut BinaryHeap<Bigram>,
        left: u32,
        right: u32,
    ) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (symbols[left as usize], symbols[right as usize]);
        // Adjacent symbols are adjacent in the text: a merge only ever absorbs the next one.
        let piece = &escaped[l.start as usize..(l.start + l.len + r.len) as usize];
        if let Some(&id) = self.pieces.get(piece) {
            heap.push(Bigram {
                score: self.scores[id as usize],
                left,
                right,
                size: l.len + r.len,
            });
        }
    }
}

/// C's `isspace` in the "C" locale, which llama.cpp strips around special tokens with.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn special(id: u32, text: &str) -> SpecialToken {
        SpecialToken {
            id,
            text: text.into(),
            lstrip: false,
            rstrip: false,
        }
    }

    /// Pieces `a`, `b`, `c`, `▁` and merges with the given scores.
    fn vocab(extra: &[(&str, f32)], specials: Vec<SpecialToken>) -> (Vec<String>, SentencePiece) {
        let mut tokens: Vec<String> = ["<unk>", "a", "b", "c", "\u{2581}"]
            .map(String::from)
            .to_vec();
        let mut scores = vec![0.0; tokens.len()];
        for (t, s) in extra {
            tokens.push(t.to_string());
            scores.push(*s);
        }
        let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let spm = SentencePiece::new(&refs, &scores, [None; 256], Some(0), true, specials).unwrap();
        (tokens, spm)
    }

    #[test]
    fn highest_score_merges_first_and_ties_go_left() {
        // "ab" beats "bc" on score: a|b|c -> ab|c.
        let (_, spm) = vocab(&[("ab", -1.0), ("bc", -2.0)], vec![]);
        assert_eq!(spm.encode_fragment_ids("abc"), vec![5, 3]);
        let (_, spm) = vocab(&[("ab", -2.0), ("bc", -1.0)], vec![]);
        assert_eq!(spm.encode_fragment_ids("abc"), vec![1, 6]);
        // Equal scores: the leftmost pair first.
        let (_, spm) = vocab(&[("ab", -1.0), ("bc", -1.0)], vec![]);
        assert_eq!(spm.encode_fragment_ids("abc"), vec![5, 3]);
    }

    #[test]
    fn specials_split_longest_first_not_leftmost() {
        let specials = vec![special(10, "ab"), special(11, "bca")];
        let (_, spm) = vocab(&[], specials);
        let parts = spm.partition("abca").unwrap();
        assert_eq!(parts, vec![Fragment::Text(0, 1), Fragment::Token(11)]);
        assert_eq!(spm.partition("cc"), None);
    }

    #[test]
    fn rstrip_drops_whitespace_after_a_special() {
        let mut s = special(10, "ab");
        s.rstrip = true;
        let (_, spm) = vocab(&[], vec![s]);
        assert_eq!(
            spm.partition("ab \n c").unwrap(),
            vec![Fragment::Token(10), Fragment::Text(5, 6)]
        );
        assert_eq!(spm.partition("ab  ").unwrap(), vec![Fragment::Token(10)]);
    }

    impl SentencePiece {
        /// Ids of a fragment without the space prefix.
        fn encode_fragment_ids(&self, text: &str) -> Vec<u32> {
            let mut out = Vec::new();
            self.encode_fragment(text, false, &mut out, &mut Scratch::default());
            out
        }
    }
}
