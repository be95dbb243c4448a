//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model = "llama"`) against llama.cpp:
//! its own test vocabularies with their inputs and expected ids (`ggml-vocab-*.gguf.inp/.out`),
//! and extra inputs (special tokens inside text, emoji, scripts, whitespace) whose ids llama.cpp
//! 0.3.36's `llama_tokenize` gave (`tests/fixtures/tokenizer/README.md` says how). Every id must
//! be identical. Then decoding: round trips, streamed byte-fallback characters, special tokens.

mod common;

use std::path::Path;

use common::{fixture, optional_vocab, read_cases, read_gguf_metadata};
use sluice_tokenizer::testing::tiny_spm_metadata;
use sluice_tokenizer::{IncrementalDecoder, Tokenizer};

fn load(path: &Path) -> Tokenizer {
    Tokenizer::from_gguf(&read_gguf_metadata(path), path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Encodes every case and compares with llama.cpp's ids; fails listing every mismatch.
/// Returns the number of cases.
fn check_cases(tok: &Tokenizer, inp: &Path, out: &Path) -> usize {
    let cases = read_cases(inp, out);
    let mut failures = Vec::new();
    for (i, (text, expected)) in cases.iter().enumerate() {
        let got = tok.encode(text).unwrap();
        if &got != expected {
            failures.push(format!(
                "case {i} {text:?}:\n  llama.cpp {expected:?}\n  sluice    {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}: {} of {} cases differ from llama.cpp:\n{}",
        inp.display(),
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("{}: {} cases, all identical", inp.display(), cases.len());
    cases.len()
}

fn llama_spm() -> Tokenizer {
    load(&fixture("ggml-vocab-llama-spm.gguf"))
}

#[test]
fn llama_spm_matches_llama_cpp_test_cases() {
    let tok = llama_spm();
    check_llama_spm_cases(&tok);
}

/// The vocabulary as a Hugging Face `tokenizer.json` (`Tokenizer::hf_json_from_gguf`, which
/// an HF checkpoint exported from a GGUF file carries) encodes every case as llama.cpp does.
#[test]
fn llama_spm_as_a_tokenizer_json_matches_llama_cpp_test_cases() {
    let path = fixture("ggml-vocab-llama-spm.gguf");
    let json = Tokenizer::hf_json_from_gguf(&read_gguf_metadata(&path), &path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokenizer.json");
    std::fs::write(&file, json).unwrap();
    let tok = Tokenizer::from_file(&file).unwrap();
    check_llama_spm_cases(&tok);
}

/// llama.cpp's 46 cases for the llama-spm vocabulary and the 330 extra ones.
fn check_llama_spm_cases(tok: &Tokenizer) {
    let n = check_cases(
        tok,
        &fixture("ggml-vocab-llama-spm.gguf.inp"),
        &fixture("ggml-vocab-llama-spm.gguf.out"),
    );
    assert_eq!(n, 46);
    check_extra_cases(tok, "llama-spm");
}

/// The inputs of `spm-extra.inp` (30) and `spm-random.inp` (300 random mixes of words, special
/// token texts, whitespace runs and other scripts) against llama.cpp's ids on `vocab`.
fn check_extra_cases(tok: &Tokenizer, vocab: &str) {
    for (set, n) in [("spm-extra", 30), ("spm-random", 300)] {
        let out = fixture(&format!("{set}.{vocab}.out"));
        assert_eq!(check_cases(tok, &fixture(&format!("{set}.inp")), &out), n);
    }
}

#[test]
fn phi3_matches_llama_cpp_test_cases() {
    let (Some(vocab), Some(inp), Some(out)) = (
        optional_vocab("ggml-vocab-phi-3.gguf"),
        optional_vocab("ggml-vocab-phi-3.gguf.inp"),
        optional_vocab("ggml-vocab-phi-3.gguf.out"),
    ) else {
        return;
    };
    let tok = load(&vocab);
    assert_eq!(check_cases(&tok, &inp, &out), 46);
    // Phi-3's special tokens swallow the whitespace after them (llama.cpp's RSTRIP, by model
    // name): `<|user|>\nWhat` is `<|user|>`, `What`.
    check_extra_cases(&tok, "phi-3");
    assert_eq!(tok.eos_token_id(), Some(32000));
    let end = tok.token_to_id("<|end|>").unwrap();
    assert!(
        tok.eos_token_ids().contains(&end),
        "{:?}",
        tok.eos_token_ids()
    );
}

#[test]
fn baichuan_matches_llama_cpp() {
    let Some(vocab) = optional_vocab("ggml-vocab-baichuan.gguf") else {
        return;
    };
    let tok = load(&vocab);
    check_extra_cases(&tok, "baichuan");
}

#[test]
fn llama_spm_reads_llama_cpp_defaults_and_ids() {
    let tok = llama_spm();
    assert_eq!(tok.vocab_size(), 32000);
    assert_eq!((tok.bos_token_id(), tok.eos_token_id()), (Some(1), Some(2)));
    assert!(tok.add_bos_token() && !tok.add_eos_token());
    assert_eq!(
        tok.encode_prompt("Hello world").unwrap(),
        vec![1, 15043, 3186]
    );
    // A template that renders BOS itself gets no second one.
    assert_eq!(
        tok.encode_prompt("<s>Hello world").unwrap(),
        vec![1, 15043, 3186]
    );
    assert_eq!(tok.encode("").unwrap(), Vec::<u32>::new());
    assert_eq!(tok.id_to_token(15043), Some("\u{2581}Hello"));
    assert_eq!(tok.token_bytes(15043), b" Hello");
    assert_eq!(tok.token_bytes(13), b"\n", "<0x0A> is a byte token");
    assert!(tok.is_special(0) && tok.is_special(1) && !tok.is_special(13));
}

#[test]
fn decode_inverts_encode_with_llama_cpp_space_rule() {
    let tok = llama_spm();
    let cases = read_cases(
        &fixture("ggml-vocab-llama-spm.gguf.inp"),
        &fixture("ggml-vocab-llama-spm.gguf.out"),
    );
    let extra = read_cases(
        &fixture("spm-extra.inp"),
        &fixture("spm-extra.llama-spm.out"),
    );
    let mut checked = 0;
    for (text, _) in cases.iter().chain(&extra) {
        let ids = tok.encode(text).unwrap();
        // Text after a special token gets a space prefix of its own, which decoding keeps
        // (as llama.cpp's does): such texts do not come back unchanged.
        // And a `▁` in the input is a space once encoded, as in llama.cpp.
        if ids.iter().any(|&id| tok.is_special(id)) || text.contains('\u{2581}') {
            continue;
        }
        // Byte fallback covers every character, so nothing is lost; the space the encoding
        // put in front is dropped again from the first token.
        assert_eq!(&tok.decode(&ids, false), text, "{ids:?}");
        // After BOS the space stays, as in llama.cpp's detokenize.
        if !text.is_empty() {
            let prompt = tok.encode_prompt(text).unwrap();
            assert_eq!(tok.decode(&prompt, true), format!(" {text}"), "{text:?}");
        }
        checked += 1;
    }
    // All but the 7 extra inputs with special tokens and the one with `▁`.
    assert_eq!(checked, 46 + 30 - 8);
}

#[test]
fn llama_cpp_detokenize_examples() {
    // What llama.cpp 0.3.36's `llama_detokenize` returns for these ids (remove_special false,
    // unparse_special true, then false): the first token loses one space, BOS keeps it.
    let tok = llama_spm();
    let cases: &[(&[u32], &str, &str)] = &[
        (&[1, 15043, 3186], "<s> Hello world", " Hello world"),
        (&[15043, 3186], "Hello world", "Hello world"),
        (&[29871, 15043], " Hello", " Hello"),
        (&[259, 15043], "  Hello", "  Hello"),
        (&[0, 15043], "<unk> Hello", " Hello"),
        (&[243, 162, 169, 156], "🦙", "🦙"),
    ];
    for &(ids, kept, skipped) in cases {
        assert_eq!(tok.decode(ids, false), kept, "{ids:?}");
        assert_eq!(tok.decode(ids, true), skipped, "{ids:?}");
    }
}

#[test]
fn streamed_byte_fallback_emoji_are_held_until_complete() {
    let tok = llama_spm();
    // The crab is not a piece of Llama's vocabulary: it falls back to its 4 UTF-8 bytes.
    let ids = tok.encode("a 🦀!").unwrap();
    assert_eq!(ids, vec![263, 29871, 243, 162, 169, 131, 29991]);
    let mut dec = IncrementalDecoder::new(true);
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| dec.push(&tok, id).to_string())
        .collect();
    assert_eq!(pieces, vec![" a", " ", "", "", "", "🦀", "!"]);
    assert!(!dec.has_pending());
    assert_eq!(dec.finish(), "");
    // A continuation keeps the leading space; the whole text's decode drops it.
    assert_eq!(pieces.concat(), " a 🦀!");
    assert_eq!(tok.decode(&ids, true), "a 🦀!");
}

#[test]
fn special_tokens_inside_text_are_single_ids() {
    let tok = llama_spm();
    let ids = tok.encode("<s>Hello world</s>").unwrap();
    assert_eq!(ids, vec![1, 15043, 3186, 2]);
    assert_eq!(tok.decode(&ids, false), "<s> Hello world</s>");
    assert_eq!(tok.decode(&ids, true), " Hello world");
    // Text after a special token gets the space prefix again; text before it does not.
    assert_eq!(tok.encode("Hello<s>world").unwrap(), vec![15043, 1, 3186]);
    let mut dec = IncrementalDecoder::new(true);
    let streamed: String = ids
        .iter()
        .map(|&id| dec.push(&tok, id).to_string())
        .collect();
    assert_eq!(streamed, " Hello world");
}

#[test]
fn characters_without_a_piece_fall_back_to_bytes_or_unknown() {
    let path = Path::new("tiny.gguf");
    let with_bytes = Tokenizer::from_gguf(&tiny_spm_metadata(true), path).unwrap();
    let hi = with_bytes.token_to_id("\u{2581}hi").unwrap();
    // "é" is C3 A9: byte tokens 3 + 0xC3 and 3 + 0xA9.
    assert_eq!(
        with_bytes.encode("hié").unwrap(),
        vec![hi, 3 + 0xC3, 3 + 0xA9]
    );
    assert_eq!(
        with_bytes.decode(&with_bytes.encode("hié").unwrap(), false),
        "hié"
    );
    let without = Tokenizer::from_gguf(&tiny_spm_metadata(false), path).unwrap();
    let hi = without.token_to_id("\u{2581}hi").unwrap();
    // Without byte tokens, one unknown id per character the vocabulary cannot spell.
    assert_eq!(without.encode("hié").unwrap(), vec![hi, 0]);
}

/// Encoding throughput, SentencePiece (llama-spm) against byte-level BPE (llama.cpp's GPT-2 and
/// Llama 3 test vocabularies, from `LLAMA_VOCAB_DIR`, default the llama.cpp tree
/// `scripts/llama-server.sh` unpacks), per byte of the same text. A measurement, not a check:
///
///     cargo test --release -p sluice-tokenizer --test spm_vocab -- --ignored --nocapture throughput
#[test]
#[ignore]
fn throughput_against_bpe() {
    let dir = std::env::var("LLAMA_VOCAB_DIR").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/sluice-peer-noamx/llama_cpp_python-0.3.36/vendor/llama.cpp/models")
    });
    // Prose, code and other scripts, in prompts of about 4 KB.
    let cases = read_cases(
        &fixture("ggml-vocab-llama-spm.gguf.inp"),
        &fixture("ggml-vocab-llama-spm.gguf.out"),
    );
    let mixed: String = cases
        .iter()
        .map(|(t, _)| t.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let prose = "The quick brown fox jumps over the lazy dog, and then it considers the \
                 meaning of life, the universe and everything while writing some code:\n\
                 fn main() { println!(\"hello, world\"); }\n";
    let mut text = String::new();
    while text.len() < 4096 {
        text.push_str(prose);
        text.push_str(&mixed[..mixed.len().min(400)]);
    }
    // Prompts of about 4 KB that repeat a paragraph (the SentencePiece path copies a word it
    // met earlier in the same text), and prompts of the fixture inputs alone, which repeat
    // little.
    let repeating: Vec<String> = (0..256).map(|i| format!("{i} {text}")).collect();
    let varied: Vec<String> = (0..256).map(|i| format!("{i} {mixed}")).collect();
    let time = |tok: &Tokenizer, prompts: &[String]| {
        let bytes: usize = prompts.iter().map(String::len).sum();
        let mut best = f64::MAX;
        let mut ids = 0;
        for _ in 0..5 {
            let start = std::time::Instant::now();
            ids = prompts
                .iter()
                .map(|p| tok.encode(p).unwrap().len())
                .sum::<usize>();
            best = best.min(start.elapsed().as_secs_f64());
        }
        (bytes as f64 / best / 1e6, bytes as f64 / ids as f64)
    };
    let mut vocabs = vec![(
        "llama-spm (SPM)".to_string(),
        fixture("ggml-vocab-llama-spm.gguf"),
    )];
    // Gemma 3's vocabulary of 262,144 pieces (`scripts/fetch-gemma.sh`), where fetched.
    let gemma = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    if gemma.is_file() {
        vocabs.push(("gemma-3 (SPM)".to_string(), gemma));
    } else {
        eprintln!("skipped gemma-3: {} missing", gemma.display());
    }
    for name in ["gpt-2", "llama-bpe"] {
        let path = Path::new(&dir).join(format!("ggml-vocab-{name}.gguf"));
        if path.is_file() {
            vocabs.push((format!("{name} (BPE)"), path));
        } else {
            eprintln!("skipped {name}: {} missing", path.display());
        }
    }
    for (name, path) in vocabs {
        let metadata = read_gguf_metadata(&path);
        let start = std::time::Instant::now();
        let tok = Tokenizer::from_gguf(&metadata, &path).unwrap();
        eprintln!(
            "{name:>18}: built in {:.0} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
        for (what, prompts) in [("repeating", &repeating), ("varied", &varied)] {
            let (mb_s, bytes_per_id) = time(&tok, prompts);
            eprintln!("{name:>18}: {what:>9} {mb_s:6.1} MB/s, {bytes_per_id:.2} bytes per id");
        }
    }
}
