//! Tokenizer build time (49k tokens, 48.9k merges) and encode time of a 4 KB prompt, for the
//! real model. Prints figures; asserts nothing.

use std::path::PathBuf;
use std::time::Instant;

use sluice_model::GgufFile;

fn main() {
    let path = std::env::var_os("SLUICE_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    let file = GgufFile::open(&path).expect("run scripts/fetch-model.sh");
    let start = Instant::now();
    let tok = file.tokenizer().unwrap();
    let build = start.elapsed();

    let mut prompt = String::new();
    while prompt.len() < 4096 {
        prompt.push_str("The quick brown fox (id 1234) jumps over the lazy dog; café, 中文! ");
    }
    let rounds = 200u32;
    let start = Instant::now();
    let mut tokens = 0;
    for i in 0..rounds {
        tokens = tok.encode(&format!("{i} {prompt}")).unwrap().len();
    }
    let encode = start.elapsed() / rounds;
    let ids = tok.encode(&prompt).unwrap();
    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(tok.decode(&ids, true));
    }
    let decode = start.elapsed() / rounds;
    println!("tokenizer build: {build:?}");
    println!(
        "encode {} bytes ({tokens} tokens): {encode:?}",
        prompt.len()
    );
    println!("decode {} tokens: {decode:?}", ids.len());
}
