//! Which files of a repository a name asks for: in a GGUF repository the file (or every shard
//! of the file) whose name carries the quant, as llama.cpp's `-hf` picks it; in a safetensors
//! repository what a directory load reads.

use crate::error::{HubError, Result};

/// The quant a name without `:QUANT` asks for, when the repository has it (llama.cpp's).
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// What to download and what to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Every file to fetch, repository paths.
    pub files: Vec<String>,
    /// What the loader opens, relative to the snapshot: the GGUF file (its first shard), or
    /// `None` for the snapshot folder itself (a safetensors directory).
    pub entry: Option<String>,
}

/// Files a safetensors directory load reads besides the weights (those present are fetched).
const DIRECTORY_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
];

/// Picks from `names` (a listing's or a cached snapshot's) what `quant` asks for.
pub fn select(repo: &str, names: &[&str], quant: Option<&str>) -> Result<Selection> {
    let ggufs: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.to_ascii_lowercase().ends_with(".gguf"))
        // Vision projectors are not a model one loads alone.
        .filter(|n| !n.to_ascii_lowercase().contains("mmproj"))
        .collect();
    if !ggufs.is_empty() {
        return select_gguf(repo, &ggufs, quant);
    }
    let has_weights = names.iter().any(|n| is_top_level_safetensors(n));
    if has_weights && names.contains(&"config.json") {
        if let Some(q) = quant {
            return Err(HubError::NoSuchFile(format!(
                "{repo} holds safetensors weights, not GGUF files: drop :{q} (the weights load \
                 as they are, or as --weights asks)"
            )));
        }
        let mut files: Vec<String> = names
            .iter()
            .filter(|n| DIRECTORY_FILES.contains(n) || is_top_level_safetensors(n))
            .map(|n| n.to_string())
            .collect();
        files.sort();
        return Ok(Selection { files, entry: None });
    }
    Err(HubError::NoSuchFile(format!(
        "{repo} holds no GGUF file and no safetensors model (config.json and *.safetensors)"
    )))
}

fn is_top_level_safetensors(name: &str) -> bool {
    !name.contains('/') && name.ends_with(".safetensors")
}

/// A GGUF file as one model: its shards grouped (`x-00001-of-00003.gguf`).
#[derive(Debug)]
struct GgufModel<'a> {
    /// The file, or the first shard.
    first: &'a str,
    /// The file alone, or every shard in order.
    files: Vec<&'a str>,
    /// Shards named but not listed.
    missing: usize,
    quant: String,
}

fn select_gguf(repo: &str, ggufs: &[&str], quant: Option<&str>) -> Result<Selection> {
    let models = group_shards(ggufs);
    let wanted = quant.unwrap_or(DEFAULT_QUANT);
    let mut matching: Vec<&GgufModel> = models
        .iter()
        .filter(|m| carries_quant(m.first, wanted))
        .collect();
    // Several files carry it (a subfolder copy, an imatrix variant): the top-level one.
    if matching.len() > 1 {
        let top: Vec<&GgufModel> = matching
            .iter()
            .copied()
            .filter(|m| !m.first.contains('/'))
            .collect();
        if top.len() == 1 {
            matching = top;
        }
    }
    let chosen = match (matching.as_slice(), quant) {
        ([one], _) => *one,
        ([], None) if models.len() == 1 => &models[0],
        ([], _) => {
            let mut quants: Vec<&str> = models.iter().map(|m| m.quant.as_str()).collect();
            quants.sort();
            quants.dedup();
            return Err(HubError::NoSuchFile(format!(
                "{repo} has no GGUF file of quant {wanted}; it has {}: name one as {repo}:QUANT",
                quants.join(", ")
            )));
        }
        (many, _) => {
            let names: Vec<&str> = many.iter().map(|m| m.first).collect();
            return Err(HubError::NoSuchFile(format!(
                "{repo} has several GGUF files of quant {wanted} ({}); name the model by a \
                 longer quant or download the file and pass its path",
                names.join(", ")
            )));
        }
    };
    if chosen.missing > 0 {
        return Err(HubError::NoSuchFile(format!(
            "{repo}: {} is one of a sharded GGUF whose listing lacks {} of its shards",
            chosen.first, chosen.missing
        )));
    }
    Ok(Selection {
        files: chosen.files.iter().map(|f| f.to_string()).collect(),
        entry: Some(chosen.first.to_string()),
    })
}

/// `(stem, index, count)` of `x-00002-of-00003.gguf`.
fn shard_of(name: &str) -> Option<(&str, usize, usize)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (base, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(index) || !digits(count) {
        return None;
    }
    Some((base, index.parse().ok()?, count.parse().ok()?))
}

fn group_shards<'a>(ggufs: &[&'a str]) -> Vec<GgufModel<'a>> {
    let mut models = Vec::new();
    for &name in ggufs {
        match shard_of(name) {
            None => models.push(GgufModel {
                first: name,
                files: vec![name],
                missing: 0,
                quant: quant_of(name.strip_suffix(".gguf").unwrap_or(name)),
            }),
            Some((base, 1, count)) => {
                let mut files = vec![name];
                for i in 2..=count {
                    let want = format!("{base}-{i:05}-of-{count:05}.gguf");
                    if let Some(&f) = ggufs.iter().find(|&&n| n == want) {
                        files.push(f);
                    }
                }
                models.push(GgufModel {
                    first: name,
                    missing: count - files.len(),
                    files,
                    quant: quant_of(base),
                });
            }
            // Later shards go with their first.
            Some(_) => {}
        }
    }
    models
}

/// Whether `name` carries `quant` as a whole word (`Q4_K` is not in `x-Q4_K_M.gguf`).
fn carries_quant(name: &str, quant: &str) -> bool {
    let file = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    let quant = quant.to_ascii_lowercase();
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    file.match_indices(&quant).any(|(at, _)| {
        let before = file[..at].chars().next_back();
        let after = file[at + quant.len()..].chars().next();
        before.is_none_or(|c| !c.is_ascii_alphanumeric()) && after.is_none_or(|c| !is_word(c))
    })
}

/// The quant a file's name carries (`Q4_K_M` of `qwen2.5-coder-1.5b-instruct-q4_k_m`), else
/// its stem: what the error lists.
fn quant_of(stem: &str) -> String {
    let file = stem.rsplit('/').next().unwrap_or(stem);
    file.rsplit(['-', '.'])
        .find(|t| is_quant_name(&t.to_ascii_uppercase()))
        .map(|t| t.to_ascii_uppercase())
        .unwrap_or_else(|| file.to_string())
}

/// `Q4_K_M`, `IQ2_XS`, `TQ1_0`, `F16`, `BF16`, `FP16`, `MXFP4_MOE`...
fn is_quant_name(t: &str) -> bool {
    let digit_after = |prefix: &str| {
        t.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    };
    digit_after("Q")
        || digit_after("IQ")
        || digit_after("TQ")
        || digit_after("F")
        || digit_after("BF")
        || digit_after("FP")
        || t.starts_with("MXFP")
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &[&str] = &[
        "README.md",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-1.5b-instruct-q4_k.gguf",
        "qwen2.5-coder-1.5b-instruct-q8_0.gguf",
        "qwen2.5-coder-1.5b-instruct-fp16-00001-of-00002.gguf",
        "qwen2.5-coder-1.5b-instruct-fp16-00002-of-00002.gguf",
        "mmproj-model-f16.gguf",
    ];

    #[test]
    fn the_quant_picks_the_file_q4_k_m_by_default() {
        let s = select("Qwen/x", QWEN, None).unwrap();
        assert_eq!(s.files, ["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]);
        assert_eq!(s.entry.as_deref(), Some(s.files[0].as_str()));
        let s = select("Qwen/x", QWEN, Some("Q4_K")).unwrap();
        assert_eq!(s.files, ["qwen2.5-coder-1.5b-instruct-q4_k.gguf"]);
        let s = select("Qwen/x", QWEN, Some("q8_0")).unwrap();
        assert_eq!(s.files, ["qwen2.5-coder-1.5b-instruct-q8_0.gguf"]);
    }

    #[test]
    fn a_sharded_gguf_is_fetched_whole_and_loaded_from_its_first_shard() {
        let s = select("Qwen/x", QWEN, Some("fp16")).unwrap();
        assert_eq!(
            s.files,
            [
                "qwen2.5-coder-1.5b-instruct-fp16-00001-of-00002.gguf",
                "qwen2.5-coder-1.5b-instruct-fp16-00002-of-00002.gguf"
            ]
        );
        assert_eq!(s.entry.as_deref(), Some(s.files[0].as_str()));
        let partial = ["m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"];
        assert!(select("o/m", &partial, Some("Q8_0")).is_err());
    }

    #[test]
    fn a_missing_quant_lists_the_quants_there_are() {
        let err = select("Qwen/x", QWEN, Some("IQ2_XS"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("IQ2_XS"), "{err}");
        for q in ["Q4_K_M", "Q4_K", "Q8_0", "FP16"] {
            assert!(err.contains(q), "{q}: {err}");
        }
        assert!(!err.contains("MMPROJ"), "{err}");
        // Without Q4_K_M and without a quant asked, the only GGUF is the model.
        let one = ["SmolLM2-135M-Instruct.Q4_1.gguf"];
        assert_eq!(select("o/s", &one, None).unwrap().files, one);
        let two = ["a.Q4_1.gguf", "a.Q8_0.gguf"];
        let err = select("o/s", &two, None).unwrap_err().to_string();
        assert!(err.contains("Q4_1, Q8_0"), "{err}");
    }

    #[test]
    fn a_safetensors_repository_fetches_what_a_directory_load_reads() {
        let names = [
            ".gitattributes",
            "README.md",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "onnx/model.onnx",
            "original/consolidated.safetensors",
        ];
        let s = select("o/m", &names, None).unwrap();
        assert_eq!(s.entry, None);
        assert_eq!(
            s.files,
            [
                "config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
        assert!(select("o/m", &names, Some("Q4_K_M")).is_err());
        assert!(select("o/m", &["README.md"], None).is_err());
    }
}
