//! Byte-level BPE encoding for GGUF vocabularies. Added tokens are cut out of the text first
//! (leftmost-longest), the pieces between are split into words by the pre-tokenizer, and each
//! word's bytes start as single-byte tokens that are merged pairwise, lowest merge rank first
//! (leftmost among equals), until no adjacent pair has a merge.
//!
//! This is what `tokenizers`' BPE model computes (and llama.cpp's), without its per-word
//! string allocations: the integration tests compare the two on the real vocabulary.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ahash::AHashMap;
use aho_corasick::{AhoCorasick, MatchKind};

use crate::byte_level::ByteLevelAlphabet;
use crate::pretokenize::PreTokenizer;
use crate::vocab::{TokenKind, TokenTable};

/// The result of merging an adjacent pair: its rank (lower merges first) and the new id.
#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    id: u32,
}

/// Marks the absence of a neighbour in a word's linked list of symbols.
const NONE: u32 = u32::MAX;

/// Symbol id of a byte the vocabulary has no token for. No merge involves it, and it is left
/// out of the result: llama.cpp's behaviour. (SmolLM2 lacks a few control bytes, e.g. 0x14.)
/// Mapping it to the unknown token instead would put `<|endoftext|>` in SmolLM2's prompts.
const MISSING_BYTE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

/// Working memory for one `encode` call, reused across its words.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    /// Candidate merges as (rank, position of the pair's left symbol), smallest first.
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

pub(crate) struct ByteLevelBpe {
    pre: PreTokenizer,
    /// Control and user-defined tokens, found in raw text before pre-tokenization.
    added: Option<AhoCorasick>,
    added_ids: Vec<u32>,
    /// The id of each single byte's token.
    byte_ids: [Option<u32>; 256],
    merges: AHashMap<(u32, u32), Merge>,
    /// For vocabularies that look a whole word up before merging (Llama 3's `ignore_merges`):
    /// word bytes -> id.
    whole_words: Option<AHashMap<Box<[u8]>, u32>>,
    vocab: AHashMap<String, u32>,
}

impl ByteLevelBpe {
    /// `tokens[id]` is each id's vocabulary text, `table` their kinds and bytes, `merges` the
    /// merge list in rank order. Fails with a reason when a merge names a token the vocabulary
    /// lacks, or the added tokens cannot be indexed.
    pub(crate) fn new(
        tokens: &[&str],
        table: &TokenTable,
        merges: &[(&str, &str)],
        pre: PreTokenizer,
        ignore_merges: bool,
    ) -> Result<Self, String> {
        let mut vocab = AHashMap::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            // A repeated text keeps its last id, as in `tokenizers` and llama.cpp.
            vocab.insert(token.to_string(), id as u32);
        }

        let mut merge_map = AHashMap::with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, (a, b)) in merges.iter().enumerate() {
            let id_of = |t: &str| {
                vocab.get(t).copied().ok_or_else(|| {
                    format!("merge {rank} `{a} {b}`: `{t}` is not in the vocabulary")
                })
            };
            let pair = (id_of(a)?, id_of(b)?);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let merge = Merge {
                rank: rank as u32,
                id: id_of(&joined)?,
            };
            merge_map.entry(pair).or_insert(merge);
        }

        let alphabet = ByteLevelAlphabet::new();
        let mut byte_ids = [None; 256];
        for (byte, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab
                .get(alphabet.char_of(byte as u8).encode_utf8(&mut [0; 4]) as &str)
                .copied();
        }

        let mut added_ids = Vec::new();
        let mut patterns = Vec::new();
        for id in 0..table.len() as u32 {
            if matches!(
                table.kind(id),
                Some(TokenKind::Special | TokenKind::Literal)
            ) {
                let text = tokens[id as usize];
                if !text.is_empty() {
                    patterns.push(text);
                    added_ids.push(id);
                }
            }
        }
        let added = if patterns.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&patterns)
                    .map_err(|e| format!("cannot index the added tokens: {e}"))?,
            )
        };

        let whole_words = ignore_merges.then(|| {
            (0..table.len() as u32)
                .filter(|&id| table.kind(id) == Some(TokenKind::Normal))
                .map(|id| (Box::from(table.bytes_of(id)), id))
                .collect()
        });

        Ok(Self {
            pre,
            added,
            added_ids,
            byte_ids,
            merges: merge_map,
            whole_words,
            vocab,
        })
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.get(token).copied()
    }

    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        // About one token per 3-4 bytes of English; a guess that avoids most regrowth.
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut scratch = Scratch::default();
        let mut plain_start = 0;
        if let Some(added) = &self.added {
            for m in added.find_iter(text) {
                self.encode_plain(&text[plain_start..m.start()], &mut out, &mut scratch);
                out.push(self.added_ids[m.pattern().as_usize()]);
                plain_start = m.end();
            }
        }
        self.encode_plain(&text[plain_start..], &mut out, &mut scratch);
        out
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>, scratch: &mut Scratch) {
        self.pre.split(text, &mut |word| {
            self.encode_word(word.as_bytes(), out, scratch)
        });
    }

    fn encode_word(&self, word: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        if let Some(id) = self.whole_words.as_ref().and_then(|w| w.get(word)) {
            out.push(*id);
            return;
        }
        let symbols = &mut scratch.symbols;
        symbols.clear();
        for (i, &byte) in word.iter().enumerate() {
            let i = i as u32;
            symbols.push(Symbol {
                id: self.byte_ids[byte as usize].unwrap_or(MISSING_BYTE),
                prev: if i == 0 { NONE } else { i - 1 },
                next: i + 1,
                alive: true,
            });
        }
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = NONE;

        let heap = &mut scratch.heap;
        heap.clear();
        for (i, pair) in symbols.windows(2).enumerate() {
            if let Some(m) = self.merges.get(&(pair[0].id, pair[1].id)) {
                heap.push(Reverse((m.rank, i as u32)));
            }
        }
        while let Some(Reverse((rank, left))) = heap.pop() {
            let l = symbols[left as usize];
            if !l.alive || l.next == NONE {
                continue;
            }
            let right = l.next;
            let r = symbols[right as usize];
            // The pair at `left` may have changed since this candidate was queued; ranks are
            // unique per pair, so an equal rank means it is still this pair.
            let merge = match self.merges.get(&(l.id, r.id)) {
                Some(m) if m.rank == rank => *m,
                _ => continue,
            };
            symbols[left as usize].id = merge.id;
            symbols[left as usize].next = r.next;
            symbols[right as usize].alive = false;
            if r.next != NONE {
                symbols[r.next as usize].prev = left;
                if let Some(m) = self.merges.get(&(merge.id, symbols[r.next as usize].id)) {
                    heap.push(Reverse((m.rank, left)));
                }
            }
            if l.prev != NONE {
                if let Some(m) = self.merges.get(&(symbols[l.prev as usize].id, merge.id)) {
                    heap.push(Reverse((m.rank, l.prev)));
                }
            }
        }

        // Symbol 0 always survives: a merge keeps its left symbol.
        let mut i = 0;
        while i != NONE {
            let s = symbols[i as usize];
            if s.id != MISSING_BYTE {
                out.push(s.id);
            }
            i = s.next;
        }
    }
}
