//! A repository's files at one revision, as the hub's model API lists them
//! (`GET /api/models/ORG/NAME/revision/REV?blobs=true`): each name, size and, for LFS files,
//! the sha256 a download is checked against. Every name is checked to be a plain relative path
//! before anything is written.

use std::path::{Component, Path};

use serde::Deserialize;

use crate::error::{HubError, Result};

/// One file of the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    /// The path within the repository (`/`-separated, checked safe).
    pub name: String,
    pub size: Option<u64>,
    /// The sha256 of an LFS file's bytes; `None` for a file kept in git itself.
    pub sha256: Option<String>,
}

/// The repository at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoListing {
    /// The commit the revision resolved to.
    pub commit: String,
    pub files: Vec<RepoFile>,
}

#[derive(Deserialize)]
struct ApiInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: String,
    #[serde(default)]
    size: Option<u64>,
}

impl RepoListing {
    /// Reads the API's answer; refuses it whole if any name could leave the snapshot folder.
    pub fn from_api_json(repo: &str, body: &str) -> Result<Self> {
        let info: ApiInfo = serde_json::from_str(body).map_err(|e| HubError::BadAnswer {
            what: format!("the file listing of {repo}"),
            reason: e.to_string(),
        })?;
        if !is_commit_id(&info.sha) {
            return Err(HubError::BadAnswer {
                what: format!("the file listing of {repo}"),
                reason: format!("{:?} is not a commit id", info.sha),
            });
        }
        let mut files = Vec::with_capacity(info.siblings.len());
        for s in info.siblings {
            if !is_safe_relative(&s.rfilename) {
                return Err(HubError::UnsafePath {
                    repo: repo.to_string(),
                    name: s.rfilename,
                });
            }
            let sha256 = match s.lfs.as_ref().map(|l| l.sha256.to_ascii_lowercase()) {
                Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => Some(h),
                Some(h) => {
                    return Err(HubError::BadAnswer {
                        what: format!("{} of {repo}", s.rfilename),
                        reason: format!("{h:?} is not a sha256"),
                    })
                }
                None => None,
            };
            files.push(RepoFile {
                size: s.lfs.as_ref().and_then(|l| l.size).or(s.size),
                name: s.rfilename,
                sha256,
            });
        }
        Ok(Self {
            commit: info.sha,
            files,
        })
    }

    pub fn file(&self, name: &str) -> Option<&RepoFile> {
        self.files.iter().find(|f| f.name == name)
    }
}

/// A git commit id: 40 hex digits (the only thing a snapshot folder may be named).
pub fn is_commit_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `a/b.gguf` yes; `../x`, `/etc/x`, `a//b`, `a/./b`, `C:x`, `a\b` no.
pub fn is_safe_relative(name: &str) -> bool {
    if name.is_empty() || name.contains('\\') || name.contains('\0') || name.contains(':') {
        return false;
    }
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return false;
    }
    Path::new(name)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    fn listing(names: &[&str]) -> Result<RepoListing> {
        let siblings: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({"rfilename": n, "size": 3}))
            .collect();
        let body = serde_json::json!({"sha": SHA, "siblings": siblings}).to_string();
        RepoListing::from_api_json("o/r", &body)
    }

    #[test]
    fn a_listing_with_a_name_outside_the_snapshot_is_refused_whole() {
        assert!(listing(&["config.json", "sub/model.gguf"]).is_ok());
        for bad in [
            "../escape.gguf",
            "/etc/passwd",
            "a/../../b",
            "./a",
            "a//b",
            "a\\..\\b",
            "",
            "C:evil",
        ] {
            match listing(&["ok.gguf", bad]) {
                Err(HubError::UnsafePath { name, .. }) => assert_eq!(name, bad),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn lfs_files_carry_their_sha256_and_size() {
        let body = serde_json::json!({
            "sha": SHA,
            "siblings": [
                {"rfilename": "README.md", "size": 10, "blobId": "ab"},
                {"rfilename": "m.gguf", "size": 99,
                 "lfs": {"sha256": "AB".repeat(32), "size": 100, "pointerSize": 130}},
            ],
        })
        .to_string();
        let l = RepoListing::from_api_json("o/r", &body).unwrap();
        assert_eq!(l.commit, SHA);
        assert_eq!(l.file("README.md").unwrap().sha256, None);
        let m = l.file("m.gguf").unwrap();
        assert_eq!(m.sha256.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!(m.size, Some(100));
        let bad = serde_json::json!({"sha": "../x", "siblings": []}).to_string();
        assert!(RepoListing::from_api_json("o/r", &bad).is_err());
    }
}
