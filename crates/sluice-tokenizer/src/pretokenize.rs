//! Splitting text into the words BPE merges run within, by hand-written scanners that match
//! exactly what the pre-tokenizer regexes of the supported vocabularies match (leftmost
//! alternative first, greedy runs, and the `\s+(?!\S)` lookahead that leaves one space for the
//! next word). A regex engine would do the same work several times slower; the unit tests
//! check every scanner against the `tokenizers` crate's regex implementation.
//!
//! Character classes: `\p{L}` is the Unicode Letter category, `\p{N}` the Number category
//! (`char::is_numeric`), `\s` the White_Space property (`char::is_whitespace`), as in
//! Oniguruma, which `tokenizers` uses.

use std::sync::LazyLock;

/// The pre-tokenizers of the GGUF vocabularies we support, by the splitting they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Every digit alone first, then GPT-2's regex on the pieces between (SmolLM, StarCoder,
    /// Refact: `Sequence[Digits(individual_digits), ByteLevel(use_regex)]` in tokenizer.json).
    DigitsThenGpt2,
    /// Qwen2: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Qwen2,
    /// Llama 3: Qwen2's regex with `\p{N}{1,3}` (numbers in groups of up to three digits).
    Llama3,
    /// GPT-4o (OpenAI's o200k, gpt-oss, Llama 4), as llama.cpp runs it ([`GPT4O_REGEX`]):
    /// a word is capitals then small letters (`camel|Case`, `XMLHttp|Request`; a run of
    /// capitals alone is one word), a contraction kept with its word (`They'Re`),
    /// numbers in groups of up to three digits, `/` and line breaks kept after punctuation.
    Gpt4o,
}

/// llama.cpp's GPT-4o regex (`LLAMA_VOCAB_PRE_TYPE_GPT4O` in `src/llama-vocab.cpp`), which it
/// runs with `std::regex` on text whose non-ASCII characters are collapsed to one stand-in per
/// Unicode category. tiktoken's o200k regex (and gpt-oss's tokenizer.json) has
/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+` and `(?i:'s|...)` where this
/// has lookaheads: here an "upper" letter is any letter but `a-z` and a "lower" letter any
/// letter but `A-Z` (so every non-ASCII letter is both), combining marks are not letters, and
/// contractions ignore ASCII case only. Both agree on ASCII text; on other text we follow
/// llama.cpp, whose ids GGUF vocabularies are checked against.
const GPT4O_REGEX: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// `tokenizer.ggml.pre` names we accept, in the order error messages list them.
pub(crate) const SUPPORTED_NAMES: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "gpt-2",
    "default",
    "qwen2",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
];

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` name.
    pub(crate) fn from_gguf_name(name: &str) -> Option<Self> {
        Some(match name {
            "smollm" | "starcoder" | "refact" => Self::DigitsThenGpt2,
            // llama.cpp's own "default" is a rough regex for files converted before the
            // pre-tokenizer was recorded; GPT-2's regex is what `tokenizers`' ByteLevel does for
            // such vocabularies, so it is the better guess.
            "gpt-2" | "default" => Self::Gpt2,
            "qwen2" => Self::Qwen2,
            "llama3" | "llama-v3" | "llama-bpe" => Self::Llama3,
            // llama.cpp's names for `LLAMA_VOCAB_PRE_TYPE_GPT4O` (it has no `o200k`).
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => Self::Gpt4o,
            _ => return None,
        })
    }

    /// Calls `emit` with each word of `text`, in order; the words concatenate to `text`.
    pub(crate) fn split<'t>(self, text: &'t str, emit: &mut impl FnMut(&'t str)) {
        match self {
            Self::Gpt2 => scan(text, gpt2_word, emit),
            Self::DigitsThenGpt2 => {
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    if c.is_numeric() {
                        scan(&text[start..i], gpt2_word, emit);
                        let end = i + c.len_utf8();
                        emit(&text[i..end]);
                        start = end;
                    }
                }
                scan(&text[start..], gpt2_word, emit);
            }
            Self::Qwen2 => scan(text, |t, i| llama3_word(t, i, 1), emit),
            Self::Llama3 => scan(text, |t, i| llama3_word(t, i, 3), emit),
            Self::Gpt4o => scan(text, gpt4o_word, emit),
        }
    }
}

/// Emits consecutive words of `text`; `word(text, i)` returns where the word at `i` ends.
fn scan<'t>(text: &'t str, word: impl Fn(&str, usize) -> usize, emit: &mut impl FnMut(&'t str)) {
    let mut i = 0;
    while i < text.len() {
        // Every scanner consumes at least one character; the max() guards the loop anyway.
        let end = word(text, i).max(i + next_len(text, i));
        emit(&text[i..end]);
        i = end;
    }
}

/// End of the GPT-2 regex match starting at `i` (`i < text.len()`).
fn gpt2_word(text: &str, i: usize) -> usize {
    if let Some(len) = contraction(&text[i..], Case::Sensitive) {
        return i + len;
    }
    let c = char_at(text, i);
    // ` ?X+` for the three non-space classes: an optional leading space, then a run.
    let j = if c == ' ' { i + 1 } else { i };
    if let Some(d) = text[j..].chars().next() {
        if is_letter(d) {
            return run(text, j, is_letter);
        }
        if d.is_numeric() {
            return run(text, j, char::is_numeric);
        }
        if !d.is_whitespace() {
            return run(text, j, is_other);
        }
    }
    whitespace_word(text, i)
}

/// End of the Llama 3 / Qwen2 regex match starting at `i`; `max_digits` is 3 or 1.
fn llama3_word(text: &str, i: usize, max_digits: usize) -> usize {
    if let Some(len) = contraction(&text[i..], Case::Insensitive) {
        return i + len;
    }
    let c = char_at(text, i);
    let after_c = i + c.len_utf8();
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if is_letter(c) {
        return run(text, i, is_letter);
    }
    if c != '\r' && c != '\n' && !c.is_numeric() && text[after_c..].starts_with(is_letter) {
        return run(text, after_c, is_letter);
    }
    if c.is_numeric() {
        return digits(text, i, max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    if let Some(end) = punctuation_word(text, i, |c| c == '\r' || c == '\n') {
        return end;
    }
    line_break_word(text, i).unwrap_or_else(|| whitespace_word(text, i))
}

/// End of the GPT-4o regex match ([`GPT4O_REGEX`]) starting at `i`.
fn gpt4o_word(text: &str, i: usize) -> usize {
    let c = char_at(text, i);
    let after_c = i + c.len_utf8();
    // The two letter alternatives, `[^\r\n\p{L}\p{N}]?` then the letters.
    let letters_at = if is_letter(c) {
        Some(i)
    } else if c != '\r' && c != '\n' && !c.is_numeric() && text[after_c..].starts_with(is_letter) {
        Some(after_c)
    } else {
        None
    };
    if let Some(j) = letters_at {
        let end = gpt4o_letters(text, j);
        return end + contraction(&text[end..], Case::AsciiInsensitive).unwrap_or(0);
    }
    // `\p{N}{1,3}`
    if c.is_numeric() {
        return digits(text, i, 3);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    if let Some(end) = punctuation_word(text, i, |c| matches!(c, '\r' | '\n' | '/')) {
        return end;
    }
    line_break_word(text, i).unwrap_or_else(|| whitespace_word(text, i))
}

/// End of the letters of a GPT-4o word starting at the letter at `j`: what the first alternative
/// (`U*L+`, "upper" letters then "lower" ones) matches, or failing that the second (`U+L*`),
/// where an upper letter is any letter but `a-z` and a lower one any letter but `A-Z`.
fn gpt4o_letters(text: &str, j: usize) -> usize {
    let upper_end = run(text, j, |c| is_letter(c) && !c.is_ascii_lowercase());
    if text[upper_end..].starts_with(|c: char| c.is_ascii_lowercase()) {
        // `U*` then `L+` from the first `a-z`, up to an `A-Z` or a non-letter.
        return run(text, upper_end, |c| is_letter(c) && !c.is_ascii_uppercase());
    }
    // The upper run ends at a non-letter: `U*` backtracks to the last letter that is also a
    // lower one (a non-ASCII letter), which `L+` then takes ("ÉCOLE" gives "É", "COLE"). An
    // all-`A-Z` run fails the first alternative and the second takes it whole.
    match text[j..upper_end]
        .char_indices()
        .rev()
        .find(|&(_, c)| !c.is_ascii())
    {
        Some((off, c)) => j + off + c.len_utf8(),
        None => upper_end,
    }
}

/// `\p{N}{1,max_digits}` at `i`, where a number starts.
fn digits(text: &str, i: usize, max_digits: usize) -> usize {
    let mut end = i;
    for d in text[i..].chars().take(max_digits) {
        if !d.is_numeric() {
            break;
        }
        end += d.len_utf8();
    }
    end
}

/// ` ?[^\s\p{L}\p{N}]+` then a run of `trailing` at `i`, if one matches there.
fn punctuation_word(text: &str, i: usize, trailing: impl Fn(char) -> bool) -> Option<usize> {
    let j = if text[i..].starts_with(' ') { i + 1 } else { i };
    if !text[j..].starts_with(is_other) {
        return None;
    }
    Some(run(text, run(text, j, is_other), trailing))
}

/// `\s*[\r\n]+` at `i`: a whitespace run up to and including its last line break, if it has
/// one.
fn line_break_word(text: &str, i: usize) -> Option<usize> {
    let ws_end = run(text, i, char::is_whitespace);
    text[i..ws_end]
        .rfind(['\r', '\n'])
        .map(|last_break| i + last_break + 1)
}

/// `\s+(?!\S)|\s+` at `i`: the whitespace run, except that a run followed by a non-space
/// leaves its last character to start the next word (so " hello" keeps its space).
fn whitespace_word(text: &str, i: usize) -> usize {
    let end = run(text, i, char::is_whitespace);
    if end == text.len() {
        return end;
    }
    match text[i..end].chars().next_back() {
        Some(last) if end - last.len_utf8() > i => end - last.len_utf8(),
        // A single whitespace character before a non-space: `\s+` takes it alone.
        _ => end.max(i + next_len(text, i)),
    }
}

/// How a contraction's letters are compared.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    /// GPT-2: `'s`, never `'S`.
    Sensitive,
    /// Llama 3 / Qwen2, `(?i:'s|...)` in a Unicode-aware regex.
    Insensitive,
    /// GPT-4o as llama.cpp writes it: `'[sS]`.
    AsciiInsensitive,
}

/// Length of a contraction suffix (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) at the start of
/// `rest`.
fn contraction(rest: &str, case: Case) -> Option<usize> {
    let mut chars = rest.strip_prefix('\'')?.chars();
    let fold = |c: char| match (case, c) {
        (Case::Sensitive, c) => c,
        // U+017F LATIN SMALL LETTER LONG S case-folds to "s" in Unicode-aware regexes.
        (Case::Insensitive, 'ſ') => 's',
        (_, c) => c.to_ascii_lowercase(),
    };
    let first = chars.next()?;
    let one = 1 + first.len_utf8();
    let want_second = match fold(first) {
        's' | 't' | 'm' | 'd' => return Some(one),
        'r' | 'v' => 'e',
        'l' => 'l',
        _ => return None,
    };
    let second = chars.next()?;
    (fold(second) == want_second).then_some(one + second.len_utf8())
}

/// End of the run of characters satisfying `class` that starts at `i`.
fn run(text: &str, i: usize, class: impl Fn(char) -> bool) -> usize {
    text[i..]
        .char_indices()
        .find(|&(_, c)| !class(c))
        .map_or(text.len(), |(off, _)| i + off)
}

fn char_at(text: &str, i: usize) -> char {
    text[i..].chars().next().unwrap_or('\0')
}

fn next_len(text: &str, i: usize) -> usize {
    text[i..].chars().next().map_or(1, char::len_utf8)
}

/// `[^\s\p{L}\p{N}]`: punctuation, symbols, controls.
fn is_other(c: char) -> bool {
    !c.is_whitespace() && !is_letter(c) && !c.is_numeric()
}

/// `\p{L}`. ASCII is answered directly; other characters by binary search in the Letter
/// ranges of the Unicode tables `regex-syntax` ships.
fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    let ranges: &[(char, char)] = &LETTER_RANGES;
    ranges
        .binary_search_by(|&(start, end)| {
            if end < c {
                std::cmp::Ordering::Less
            } else if start > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

static LETTER_RANGES: LazyLock<Vec<(char, char)>> = LazyLock::new(|| {
    use regex_syntax::hir::{Class, HirKind};
    match regex_syntax::parse(r"\p{L}").map(|hir| hir.into_kind()) {
        Ok(HirKind::Class(Class::Unicode(class))) => class
            .ranges()
            .iter()
            .map(|r| (r.start(), r.end()))
            .collect(),
        // Unreachable with regex-syntax's Unicode tables compiled in; the unit tests would
        // catch it (non-ASCII letters would stop being letters).
        _ => Vec::new(),
    }
});

impl PreTokenizer {
    /// The same pre-tokenizer built from the `tokenizers` crate (regexes run by Oniguruma), as
    /// the vocabularies' tokenizer.json files declare it (GPT-4o: as llama.cpp writes it): the
    /// oracle of the scanners' tests, and what a GGUF vocabulary exported as tokenizer.json
    /// declares.
    pub(crate) fn hf_pre_tokenizer(self) -> tokenizers::PreTokenizerWrapper {
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::pre_tokenizers::digits::Digits;
        use tokenizers::pre_tokenizers::sequence::Sequence;
        use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
        use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};
        let split = |regex: &str| -> PreTokenizerWrapper {
            Split::new(
                SplitPattern::Regex(regex.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .expect("the pre-tokenizer regexes compile")
            .into()
        };
        let byte_level = |use_regex| ByteLevel::new(false, true, use_regex).into();
        let llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        let qwen2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        match self {
            Self::Gpt2 => byte_level(true),
            Self::DigitsThenGpt2 => {
                Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into()
            }
            Self::Qwen2 => Sequence::new(vec![split(qwen2), byte_level(false)]).into(),
            Self::Llama3 => Sequence::new(vec![split(llama3), byte_level(false)]).into(),
            // llama.cpp's form of the regex, not tiktoken's: an exported tokenizer.json then
            // splits as sluice and llama.cpp do (see `GPT4O_REGEX`).
            Self::Gpt4o => Sequence::new(vec![split(GPT4O_REGEX), byte_level(false)]).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{
        OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _, PreTokenizerWrapper,
    };

    fn oracle(kind: PreTokenizer) -> PreTokenizerWrapper {
        kind.hf_pre_tokenizer()
    }

    fn oracle_words(pre: &PreTokenizerWrapper, text: &str) -> Vec<String> {
        let mut pts = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut pts).unwrap();
        pts.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (start, end), _)| text[start..end].to_string())
            .collect()
    }

    fn our_words(kind: PreTokenizer, text: &str) -> Vec<String> {
        let mut words = Vec::new();
        kind.split(text, &mut |w| words.push(w.to_string()));
        words
    }

    const ALL: [PreTokenizer; 5] = [
        PreTokenizer::Gpt2,
        PreTokenizer::DigitsThenGpt2,
        PreTokenizer::Qwen2,
        PreTokenizer::Llama3,
        PreTokenizer::Gpt4o,
    ];

    /// Characters that exercise every branch: each class, the contraction letters in both
    /// cases, line breaks, exotic spaces, combining marks, digits of other scripts, emoji.
    const POOL: &[char] = &[
        'a',
        'B',
        's',
        'S',
        't',
        'r',
        'E',
        'v',
        'm',
        'l',
        'L',
        'd',
        'x',
        '\'',
        ' ',
        ' ',
        ' ',
        '\n',
        '\r',
        '\t',
        '\u{a0}',
        '\u{2009}',
        '\u{3000}',
        '\u{85}',
        '0',
        '7',
        '٣',
        '²',
        'Ⅻ',
        '.',
        ',',
        '(',
        '!',
        '-',
        '_',
        '$',
        '€',
        '\u{1F980}',
        '中',
        'é',
        'ß',
        'Ж',
        'ſ',
        '\u{301}',
        '\u{94d}',
        'न',
        '\u{200d}',
        '\u{0}',
        '\u{7f}',
        'ǅ',
        'ʰ',
        'ª',
        'É',
        'Σ',
        'σ',
        '/',
        'D',
        'z',
    ];

    #[test]
    fn scanners_match_the_regex_pre_tokenizers() {
        let samples = [
            "Hello, world!",
            "  leading spaces",
            "trailing spaces   ",
            "tabs\tand\nnewlines\n\n",
            "don't I'll we've they're DON'T I'LL WE'VE 'S 'Re 'ſ",
            "12345 3.14159 1,000,000 x1234567",
            "a  b   c\n\n  d \n e\r\n\r\nf",
            "日本語のテキスト émoji 🦀👍🏽 done",
            "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)",
            " non\u{a0}breaking\u{2009}thin ",
            "'",
            " ",
            "\n",
            "x'",
            "''s",
            "?'s",
            "camelCaseWord XMLHttpRequest getHTTPResponseCode ALLCAPS iPhone",
            "ÉCOLE école École NAÏVE ΑΒΓ αβγ Αβγ ǄUNGLA ǅungla",
            "cafe\u{301} nai\u{308}ve \u{301}x नमस्ते",
            "I'M They'Re x'S É's É'S what'sUp DON'T",
            "path/to/file\n/next a//\n/\nb ./\r\n/x http://a.b/c\n",
        ];
        for kind in ALL {
            let pre = oracle(kind);
            for text in samples {
                assert_eq!(
                    our_words(kind, text),
                    oracle_words(&pre, text),
                    "{kind:?} {text:?}"
                );
            }
        }
    }

    #[test]
    fn scanners_match_the_regex_pre_tokenizers_on_random_text() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for kind in ALL {
            let pre = oracle(kind);
            for _ in 0..3000 {
                let len = (next() % 24) as usize;
                let text: String = (0..len)
                    .map(|_| POOL[(next() % POOL.len() as u64) as usize])
                    .collect();
                assert_eq!(
                    our_words(kind, &text),
                    oracle_words(&pre, &text),
                    "{kind:?} {text:?}"
                );
            }
        }
    }

    /// llama.cpp's own GPT-4o split (its `unicode_regex_split`, `std::regex` on collapsed text)
    /// of tricky and random strings: `tests/fixtures/tokenizer/gpt-4o-split.jsonl`, made by
    /// `scripts/gpt4o-tokenize-fixture.py`.
    #[test]
    fn gpt4o_matches_llama_cpp_split() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tokenizer/gpt-4o-split.jsonl"
        );
        let raw = std::fs::read_to_string(path).unwrap();
        let mut failures = Vec::new();
        let mut n = 0;
        for line in raw.lines() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let text = row["text"].as_str().unwrap();
            let words: Vec<&str> = row["words"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap())
                .collect();
            let ours = our_words(PreTokenizer::Gpt4o, text);
            if ours != words {
                failures.push(format!(
                    "{text:?}:\n  llama.cpp {words:?}\n  sluice    {ours:?}"
                ));
            }
            n += 1;
        }
        assert_eq!(n, 482);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// On ASCII text llama.cpp's GPT-4o regex splits as tiktoken's o200k regex (the one
    /// gpt-oss's tokenizer.json declares); `GPT4O_REGEX` says where they part.
    #[test]
    fn gpt4o_matches_tiktoken_o200k_on_ascii() {
        use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
        let o200k = concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        );
        let tiktoken: PreTokenizerWrapper = Split::new(
            SplitPattern::Regex(o200k.into()),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap()
        .into();
        let ascii: Vec<char> = POOL.iter().copied().filter(char::is_ascii).collect();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let len = (next() % 24) as usize;
            let text: String = (0..len)
                .map(|_| ascii[(next() % ascii.len() as u64) as usize])
                .collect();
            assert_eq!(
                our_words(PreTokenizer::Gpt4o, &text),
                oracle_words(&tiktoken, &text),
                "{text:?}"
            );
        }
        // Where they part: non-ASCII case, combining marks, non-ASCII contractions.
        for (text, llama_cpp) in [
            ("ÉCOLE", &["É", "COLE"][..]),
            ("cafe\u{301}", &["cafe", "\u{301}"]),
            ("x'ſ", &["x", "'ſ"]),
        ] {
            assert_eq!(our_words(PreTokenizer::Gpt4o, text), llama_cpp, "{text:?}");
            assert_ne!(oracle_words(&tiktoken, text), llama_cpp, "{text:?}");
        }
    }

    #[test]
    fn letter_table_is_loaded() {
        assert!(LETTER_RANGES.len() > 100);
        assert!(is_letter('é') && is_letter('中') && is_letter('ʰ') && is_letter('ǅ'));
        assert!(!is_letter('\u{301}') && !is_letter('٣') && !is_letter('€'));
    }

    #[test]
    fn unknown_names_are_rejected_and_listed_ones_accepted() {
        assert_eq!(PreTokenizer::from_gguf_name("llama"), None);
        for name in SUPPORTED_NAMES {
            assert!(PreTokenizer::from_gguf_name(name).is_some(), "{name}");
        }
    }
}
