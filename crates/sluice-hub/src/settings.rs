//! Where the hub is, who we are to it and where its files are kept: the environment variables
//! `huggingface_hub` reads, with its defaults, so that both share one cache and one login.

use std::path::{Path, PathBuf};

/// The hub's public address, when `HF_ENDPOINT` names none.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Clone, PartialEq, Eq)]
pub struct HubSettings {
    /// `HF_ENDPOINT`, without a trailing `/`.
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file `huggingface-cli login` wrote (`HF_TOKEN_PATH`, else
    /// `HF_HOME/token`). Sent to `endpoint` only.
    pub token: Option<String>,
    /// `HF_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    /// `~/.cache/huggingface/hub`.
    pub cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE=1`: the cache alone, no request.
    pub offline: bool,
}

impl std::fmt::Debug for HubSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubSettings")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("cache_dir", &self.cache_dir)
            .field("offline", &self.offline)
            .finish()
    }
}

impl HubSettings {
    /// From the process's environment.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// From `var` (a lookup of environment variables; tests pass their own).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let home_dir = var("HOME").map(PathBuf::from);
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| home_dir.as_ref().map(|h| h.join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token = var("HF_TOKEN").or_else(|| {
            let path = var("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| hf_home.join("token"));
            read_token(&path)
        });
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v));
        Self {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            token: token
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
            cache_dir,
            offline,
        }
    }
}

fn read_token(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// huggingface_hub's reading of a boolean variable.
fn is_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> HubSettings {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubSettings::from_vars(|k| vars.get(k).cloned())
    }

    #[test]
    fn reads_the_variables_huggingface_hub_reads() {
        let s = settings(&[("HOME", "/home/u")]);
        assert_eq!(s.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(s.cache_dir, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert!(!s.offline && s.token.is_none());

        let s = settings(&[
            ("HOME", "/home/u"),
            ("HF_HOME", "/data/hf"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "1"),
            ("HF_TOKEN", "hf_x\n"),
        ]);
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert_eq!(s.cache_dir, PathBuf::from("/data/hf/hub"));
        assert!(s.offline);
        assert_eq!(s.token.as_deref(), Some("hf_x"));
        assert!(!format!("{s:?}").contains("hf_x"), "never logged");

        let s = settings(&[("HF_HOME", "/data/hf"), ("HF_HUB_CACHE", "/fast/hub")]);
        assert_eq!(s.cache_dir, PathBuf::from("/fast/hub"));
    }

    #[test]
    fn the_login_token_file_is_read_when_hf_token_is_unset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "hf_file\n").unwrap();
        let home = dir.path().to_str().unwrap();
        let s = settings(&[("HF_HOME", home)]);
        assert_eq!(s.token.as_deref(), Some("hf_file"));
        let s = settings(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")]);
        assert_eq!(s.token.as_deref(), Some("hf_env"));
    }
}
