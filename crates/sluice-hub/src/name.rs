//! What `--model` names: a file or directory on this host, or a repository on the hub
//! (`ORG/NAME[:QUANT]`, as llama.cpp's `-hf` reads it).

use std::fmt;
use std::path::{Path, PathBuf};

/// A repository on the hub and, for a GGUF repository, the quantization asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubName {
    /// `ORG/NAME`.
    pub repo: String,
    /// The quant after `:` (`Q4_K_M`), as written; `None`: Q4_K_M if the repository has it,
    /// else its only GGUF.
    pub quant: Option<String>,
}

impl HubName {
    /// `ORG/NAME` or `ORG/NAME:QUANT`; `None` for anything else. Each part is what the hub
    /// accepts in a name: letters, digits, `-`, `_`, `.`, not starting with `.` or `-`.
    pub fn parse(s: &str) -> Option<Self> {
        let (repo, quant) = match s.split_once(':') {
            Some((repo, quant)) => (repo, Some(quant)),
            None => (s, None),
        };
        let (org, name) = repo.split_once('/')?;
        if !is_name_part(org) || !is_name_part(name) {
            return None;
        }
        let quant = match quant {
            Some(q) if is_name_part(q) => Some(q.to_string()),
            Some(_) => return None,
            None => None,
        };
        Some(Self {
            repo: repo.to_string(),
            quant,
        })
    }

    /// `models--ORG--NAME`: the repository's folder in the cache.
    pub fn cache_folder(&self) -> String {
        hf_hub::Repo::model(self.repo.clone()).folder_name()
    }
}

impl fmt::Display for HubName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

fn is_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && !s.starts_with(['.', '-'])
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    Path(PathBuf),
    Hub(HubName),
}

impl ModelRef {
    /// A path that exists is a path; otherwise a hub name if it reads as one and not as a
    /// file name (`models/x.gguf` on a machine that has not fetched it yet stays a path, so
    /// its error says the file is missing rather than asking the hub for a repository named
    /// `models/x.gguf`).
    pub fn classify(arg: &Path) -> Self {
        if arg.exists() {
            return Self::Path(arg.to_path_buf());
        }
        let Some(s) = arg.to_str() else {
            return Self::Path(arg.to_path_buf());
        };
        let looks_like_a_file = [".gguf", ".safetensors", ".json", ".bin"]
            .iter()
            .any(|ext| s.to_ascii_lowercase().ends_with(ext));
        match HubName::parse(s) {
            Some(name) if !looks_like_a_file => Self::Hub(name),
            _ => Self::Path(arg.to_path_buf()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_as_llama_cpp_does() {
        let n = HubName::parse("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M").unwrap();
        assert_eq!(n.repo, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF");
        assert_eq!(n.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(
            n.to_string(),
            "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M"
        );
        assert_eq!(
            n.cache_folder(),
            "models--Qwen--Qwen2.5-Coder-1.5B-Instruct-GGUF"
        );
        let n = HubName::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
        assert_eq!(n.quant, None);
        for bad in [
            "a",
            "a/b/c",
            "/abs/path",
            "../x/y",
            "a/..",
            "a/b:",
            "a/b:c:d",
            "a/.hidden",
            "a b/c",
            "",
        ] {
            assert_eq!(HubName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn existing_paths_and_file_names_stay_paths() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("org");
        std::fs::create_dir(&existing).unwrap();
        assert_eq!(
            ModelRef::classify(&existing),
            ModelRef::Path(existing.clone())
        );
        let missing_file = Path::new("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(
            ModelRef::classify(missing_file),
            ModelRef::Path(missing_file.to_path_buf())
        );
        assert!(matches!(
            ModelRef::classify(Path::new("Qwen/Qwen2.5-0.5B-Instruct-GGUF")),
            ModelRef::Hub(_)
        ));
    }
}
