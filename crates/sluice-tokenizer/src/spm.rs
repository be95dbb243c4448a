//! SentencePiece encoding for GGUF vocabularies (`tokenizer.ggml.model = "llama"`), computing
//! exactly what llama.cpp's `llm_tokenizer_spm` computes, so that a prompt is the same ids here
//! and there:
//!
//! 1. The text is cut around special tokens (control, unknown and user-defined ones) the way
//!    llama.cpp's `tokenizer_st_partition` cuts it: one token at a time, longest text first,
//!    each splitting every text fragment at its leftmost non-overlapping occurrences. This is
//!    not leftmost-longest matching: with `XY` and `YZW` both special, `XYZW` is `X`, `YZW`.
//!    (Among texts of equal length the lower id goes first; llama.cpp's unstable sort leaves
//!    that order open, and it matters only for overlapping specials of one length.)
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

use std::collections::BinaryHeap;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use ahash::{AHashMap, AHashSet};
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

/// One symbol of a fragment being merged, linked to its neighbours: its id (a vocabulary id,
/// or a char-only id), and the character it started as, for the byte fallback. A merge turns
/// the left symbol into the merged piece and unlinks the right one.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    ch: char,
    prev: u32,
    next: u32,
}

/// A merge candidate as one integer, so the heap compares 8 bytes: the score's bits made
/// order-preserving above, the left symbol's position inverted below. The heap's top is then
/// the highest score, and among equal scores the leftmost pair: llama.cpp's
/// `llm_bigram_spm::comparator`.
fn bigram_key(score: f32, left: u32) -> u64 {
    let bits = score.to_bits();
    let ordered = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(ordered) << 32) | u64::from(u32::MAX - left)
}

/// The left symbol's position in a [`bigram_key`].
fn bigram_left(key: u64) -> u32 {
    u32::MAX - key as u32
}

/// Working memory for one `encode` call, reused across its fragments.
#[derive(Default)]
struct Scratch<'t> {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<u64>,
    /// The segments of this text merged so far (after the space prefix or not) and where
    /// their ids lie in the output.
    seen: AHashMap<(bool, &'t str), std::ops::Range<usize>>,
}

/// Two adjacent symbols' ids as one key of the merges' table.
fn pair(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// The merges' hasher: one multiply of the pair's key (a table of half a million pairs for a
/// 262,144-piece vocabulary is probed twice a merge; SipHash or aHash over a tuple cost more
/// than the probe).
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, key: u64) {
        // Fibonacci hashing: the high bits mix every bit of the key.
        self.0 = key.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32);
    }
}

/// The id of a character no piece starts or ends with: it never merges.
const UNMERGEABLE: u32 = u32::MAX - 1;

pub(crate) struct SentencePiece {
    /// Every token's text, whatever its type (llama.cpp's `token_to_id`: control tokens'
    /// texts can be merged into too). A repeated text keeps its last id, as there.
    pieces: AHashMap<Box<str>, u32>,
    /// Adjacent symbols whose concatenation is a piece: (left id, right id) -> the piece's id
    /// and score. Every piece split at every character boundary, wherever both halves can be
    /// symbols (a piece, or a single character): llama.cpp looks the concatenated text up
    /// instead, which is the same question asked with a string hash per candidate.
    merges: HashMap<u64, (u32, f32), BuildHasherDefault<PairHasher>>,
    /// The symbol id of each character: its piece's id, or an id past the vocabulary for a
    /// character that is no piece but is half of one; `UNMERGEABLE` for the rest.
    ascii_ids: [u32; 128],
    char_ids: AHashMap<char, u32>,
    /// Ids below this are vocabulary ids; the rest are characters without a piece.
    vocab_size: u32,
    /// The characters some piece has right before a `▁`, where the text cannot be cut.
    ascii_joins_space: [bool; 128],
    joins_space: AHashSet<char>,
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
        let score = |id: u32| match scores[id as usize] {
            s if s.is_nan() => f32::NEG_INFINITY,
            s => s + 0.0,
        };
        let vocab_size = tokens.len() as u32;
        let mut char_ids: AHashMap<char, u32> = AHashMap::new();
        for (text, &id) in &pieces {
            if let Some(c) = single_char(text) {
                char_ids.insert(c, id);
            }
        }
        let mut merges =
            HashMap::with_capacity_and_hasher(tokens.len() * 2, BuildHasherDefault::default());
        for (text, &id) in &pieces {
            for (at, _) in text.char_indices().skip(1) {
                let (a, b) = text.split_at(at);
                let mut symbol_id = |half: &str| {
                    if let Some(&id) = pieces.get(half) {
                        return Some(id);
                    }
                    let c = single_char(half)?;
                    let next = vocab_size + char_ids.len() as u32;
                    Some(*char_ids.entry(c).or_insert(next))
                };
                if let (Some(left), Some(right)) = (symbol_id(a), symbol_id(b)) {
                    merges.insert(pair(left, right), (id, score(id)));
                }
            }
        }
        let mut joins_space = AHashSet::new();
        for text in pieces.keys() {
            let mut prev = None;
            for c in text.chars() {
                if let (Some(p), ESCAPED_SPACE) = (prev, c) {
                    joins_space.insert(p);
                }
                prev = Some(c);
            }
        }
        let ascii_joins_space = std::array::from_fn(|c| joins_space.contains(&char::from(c as u8)));
        let mut ascii_ids = [UNMERGEABLE; 128];
        for (c, slot) in ascii_ids.iter_mut().enumerate() {
            if let Some(&id) = char_ids.get(&char::from(c as u8)) {
                *slot = id;
            }
        }
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
            merges,
            ascii_ids,
            char_ids,
            vocab_size,
            ascii_joins_space,
            joins_space,
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

    fn char_id(&self, c: char) -> u32 {
        match self.ascii_ids.get(c as usize) {
            Some(&id) => id,
            None => self.char_ids.get(&c).copied().unwrap_or(UNMERGEABLE),
        }
    }

    /// Appends the ids of one text fragment (no special tokens in it).
    ///
    /// Merges never cross a boundary no piece spans, so the fragment is merged in segments cut
    /// at such boundaries, which gives the same ids as merging it whole and keeps each heap
    /// small. The boundaries checked are those before a space (`▁`) whose previous character
    /// no piece has right before a `▁`: in SentencePiece vocabularies `▁` starts pieces (or
    /// runs of itself), so this cuts the text into words, as the BPE pre-tokenizers do.
    fn encode_fragment<'t>(
        &self,
        text: &'t str,
        prefix: bool,
        out: &mut Vec<u32>,
        s: &mut Scratch<'t>,
    ) {
        let (mut start, mut segment_prefix) = (0, prefix);
        let mut prev = None;
        for (i, c) in text.char_indices() {
            if c == ' ' && prev.is_some_and(|p| !self.joins_space(p)) {
                self.encode_segment(&text[start..i], segment_prefix, out, s);
                (start, segment_prefix) = (i, false);
            }
            prev = Some(if c == ' ' { ESCAPED_SPACE } else { c });
        }
        self.encode_segment(&text[start..], segment_prefix, out, s);
    }

    /// Appends the ids of one segment (after the `▁` of the space prefix, where `prefix`).
    /// A segment met before in the same text (a repeated word) copies the ids it got then:
    /// merging depends on the segment's characters alone.
    fn encode_segment<'t>(
        &self,
        segment: &'t str,
        prefix: bool,
        out: &mut Vec<u32>,
        s: &mut Scratch<'t>,
    ) {
        if let Some(ids) = s.seen.get(&(prefix, segment)) {
            out.extend_from_within(ids.clone());
            return;
        }
        let begin = out.len();
        let space = self.char_id(ESCAPED_SPACE);
        s.symbols.clear();
        if prefix {
            push_symbol(&mut s.symbols, space, ESCAPED_SPACE);
        }
        for c in segment.chars() {
            if c == ' ' {
                push_symbol(&mut s.symbols, space, ESCAPED_SPACE);
            } else {
                push_symbol(&mut s.symbols, self.char_id(c), c);
            }
        }
        self.merge_segment(s, out);
        s.seen.insert((prefix, segment), begin..out.len());
    }

    /// Whether some piece has `c` right before a `▁`.
    fn joins_space(&self, c: char) -> bool {
        match self.ascii_joins_space.get(c as usize) {
            Some(&joins) => joins,
            None => self.joins_space.contains(&c),
        }
    }

    /// Merges the symbols of `s` and appends their ids.
    fn merge_segment(&self, s: &mut Scratch<'_>, out: &mut Vec<u32>) {
        let symbols = &mut s.symbols;
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = NONE;

        let heap = &mut s.heap;
        heap.clear();
        for left in 1..symbols.len() as u32 {
            self.push_bigram(symbols, heap, left - 1, left);
        }
        while let Some(key) = heap.pop() {
            let left = bigram_left(key);
            let l = symbols[left as usize];
            if l.next == NONE {
                continue;
            }
            let r = symbols[l.next as usize];
            // The candidate may be stale (either symbol merged since). It is taken when the
            // pair now at `left` has exactly its score: then the pair's own candidate has the
            // same key, and which of two equal keys pops first makes no difference. A merged-
            // away symbol has no `next` and the unmergeable id, so it never matches.
            let Some(&(merged, score)) = self.merges.get(&pair(l.id, r.id)) else {
                continue;
            };
            if bigram_key(score, left) != key {
                continue;
            }
            let right = l.next;
            symbols[left as usize].id = merged;
            symbols[left as usize].next = r.next;
            symbols[right as usize].prev = NONE;
            symbols[right as usize].next = NONE;
            symbols[right as usize].id = UNMERGEABLE;
            if r.next != NONE {
                symbols[r.next as usize].prev = left;
            }
            self.push_bigram(symbols, heap, l.prev, left);
            self.push_bigram(symbols, heap, left, r.next);
        }

        // Symbol 0 always survives: a merge keeps its left symbol.
        let mut i = 0;
        while i != NONE {
            let sym = symbols[i as usize];
            if sym.id < self.vocab_size {
                out.push(sym.id);
            } else {
                // Only a single character can be without a piece: every merge made one. (So
                // llama.cpp's `rev_merge` re-segmentation, keyed by merged texts, never applies.)
                self.push_fallback(sym.ch, out);
            }
            i = sym.next;
        }
    }

    /// A character without a piece: its UTF-8 bytes as byte tokens, or one unknown id where
    /// some byte has none (where llama.cpp would throw; what SentencePiece itself gives).
    fn push_fallback(&self, c: char, out: &mut Vec<u32>) {
        let mut buf = [0; 4];
        let bytes = c.encode_utf8(&mut buf).as_bytes();
        if bytes
            .iter()
            .all(|&b| self.byte_fallback[b as usize].is_some())
        {
            out.extend(bytes.iter().filter_map(|&b| self.byte_fallback[b as usize]));
        } else if let Some(unk) = self.unk {
            out.push(unk);
        }
    }

    /// Queues the merge of `left` and `right` if their concatenation is a piece.
    fn push_bigram(&self, symbols: &[Symbol], heap: &mut BinaryHeap<u64>, left: u32, right: u32) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (symbols[left as usize], symbols[right as usize]);
        if let Some(&(_, score)) = self.merges.get(&pair(l.id, r.id)) {
            heap.push(bigram_key(score, left));
        }
    }
}

/// Appends a symbol linked after the last one (its `next` is fixed up when merging starts).
fn push_symbol(symbols: &mut Vec<Symbol>, id: u32, ch: char) {
    let i = symbols.len() as u32;
    symbols.push(Symbol {
        id,
        ch,
        prev: if i == 0 { NONE } else { i - 1 },
        next: i + 1,
    });
}

/// The character `text` is, if it is exactly one.
fn single_char(text: &str) -> Option<char> {
    let mut chars = text.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some(c)
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
    fn pieces_with_an_inner_space_keep_the_text_whole() {
        // `a▁b` spans the space after `a`: the fragment must not be cut there.
        let (_, spm) = vocab(&[("a\u{2581}", -1.0), ("a\u{2581}b", -0.5)], vec![]);
        assert_eq!(spm.encode_fragment_ids("a b"), vec![6]);
        // Nothing spans the space after `c`: cut, and each side merged alone.
        assert_eq!(spm.encode_fragment_ids("c b"), vec![3, 4, 2]);
    }

    #[test]
    fn bigram_keys_order_by_score_then_leftmost() {
        let scores = [
            f32::NEG_INFINITY,
            -1e9,
            -2.5,
            -0.5,
            0.0,
            1e-30,
            3.0,
            f32::INFINITY,
        ];
        for pair in scores.windows(2) {
            assert!(bigram_key(pair[0], 0) < bigram_key(pair[1], 7), "{pair:?}");
        }
        assert!(bigram_key(-1.0, 3) > bigram_key(-1.0, 4));
        assert_eq!(bigram_left(bigram_key(-1.0, 12345)), 12345);
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
