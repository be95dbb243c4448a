//! The shared cache, laid out as `huggingface_hub` lays it, so that either fills it for the
//! other:
//!
//! ```text
//! HF_HUB_CACHE/models--ORG--NAME/blobs/ETAG              the bytes, named by etag (LFS: sha256)
//! HF_HUB_CACHE/models--ORG--NAME/blobs/ETAG.incomplete   a download under way (resumed from its size)
//! HF_HUB_CACHE/models--ORG--NAME/snapshots/COMMIT/FILE   a relative symlink to ../../blobs/ETAG
//! HF_HUB_CACHE/models--ORG--NAME/refs/REVISION           the commit the revision last resolved to
//! HF_HUB_CACHE/.locks/models--ORG--NAME/ETAG.lock        held while the blob downloads
//! ```
//!
//! Every file enters the snapshot by a rename of a finished, checked blob and a symlink made
//! under a temporary name and renamed: a reader sees the whole file or none.

use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};
use crate::listing::{is_commit_id, is_safe_relative};
use crate::name::HubName;

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
    dir: PathBuf,
    folder: String,
}

impl RepoCache {
    pub fn new(cache_dir: &Path, name: &HubName) -> Self {
        let folder = name.cache_folder();
        Self {
            root: cache_dir.to_path_buf(),
            dir: cache_dir.join(&folder),
            folder,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn lock(&self, etag: &str) -> PathBuf {
        self.root
            .join(".locks")
            .join(&self.folder)
            .join(format!("{etag}.lock"))
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// The commit `revision` resolved to when last fetched (a commit id is its own).
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_commit_id(revision) && self.snapshot(revision).is_dir() {
            return Some(revision.to_string());
        }
        let commit = std::fs::read_to_string(self.dir.join("refs").join(revision)).ok()?;
        let commit = commit.trim();
        is_commit_id(commit).then(|| commit.to_string())
    }

    /// `file` of `commit`, when the snapshot holds it whole.
    pub fn cached_file(&self, commit: &str, file: &str) -> Option<PathBuf> {
        let path = self.snapshot(commit).join(file);
        path.is_file().then_some(path)
    }

    /// Points the snapshot's `file` at the finished blob `etag`.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
        debug_assert!(is_safe_relative(file) && is_commit_id(commit));
        let link = self.snapshot(commit).join(file);
        let parent = link.parent().expect("a snapshot file has a folder");
        std::fs::create_dir_all(parent)
            .map_err(HubError::io("cannot create the snapshot folder", parent))?;
        // From snapshots/COMMIT/a/b/FILE up to the repository folder: one `..` a level.
        let depth = file.split('/').count() + 1;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        let staged = parent.join(format!(
            ".{}.sluice-link",
            link.file_name().unwrap().to_string_lossy()
        ));
        let _ = std::fs::remove_file(&staged);
        symlink(&target, &staged)
            .map_err(HubError::io("cannot link the snapshot file", &staged))?;
        std::fs::rename(&staged, &link)
            .map_err(HubError::io("cannot link the snapshot file", &link))?;
        Ok(link)
    }

    /// Records that `revision` resolved to `commit` (written whole, by rename).
    pub fn set_ref(&self, revision: &str, commit: &str) -> Result<()> {
        if is_commit_id(revision) {
            // huggingface_hub keeps no ref for a commit asked by its id.
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        let parent = path.parent().expect("a ref has a folder");
        std::fs::create_dir_all(parent).map_err(HubError::io("cannot create refs", parent))?;
        let staged = parent.join(format!(
            ".{}.sluice-ref",
            path.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&staged, commit).map_err(HubError::io("cannot write the ref", &staged))?;
        std::fs::rename(&staged, &path).map_err(HubError::io("cannot write the ref", &path))
    }

    /// Every file the snapshot of `commit` holds, as repository paths.
    pub fn snapshot_files(&self, commit: &str) -> Vec<String> {
        let mut names = Vec::new();
        walk(&self.snapshot(commit), "", &mut names);
        names.sort();
        names
    }
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if path.is_dir() {
            walk(&path, &rel, out);
        } else if path.is_file() {
            out.push(rel);
        }
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    // Without symlinks huggingface_hub copies; a hard link to the blob is as good here.
    let blob = link.parent().unwrap().join(target);
    std::fs::hard_link(blob, link)
}

/// A repository the cache holds, for `sluice models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRepo {
    /// `ORG/NAME`.
    pub repo: String,
    /// `(revision, commit)` of each ref.
    pub refs: Vec<(String, String)>,
    /// Files of every snapshot, `(commit, path, bytes)`.
    pub files: Vec<(String, String, u64)>,
    /// Bytes of its finished blobs (a blob two snapshots share counted once).
    pub bytes: u64,
}

/// Every model repository in the cache at `cache_dir`, by name.
pub fn cached_repos(cache_dir: &Path) -> Vec<CachedRepo> {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return Vec::new();
    };
    let mut repos = Vec::new();
    for entry in entries.flatten() {
        let folder = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = folder.strip_prefix("models--") else {
            continue;
        };
        let Some((org, name)) = rest.split_once("--") else {
            continue;
        };
        let Some(hub) = HubName::parse(&format!("{org}/{name}")) else {
            continue;
        };
        let cache = RepoCache::new(cache_dir, &hub);
        let mut refs = Vec::new();
        let mut ref_names = Vec::new();
        walk(&cache.dir.join("refs"), "", &mut ref_names);
        for r in ref_names {
            if let Some(commit) = cache.commit_of(&r) {
                refs.push((r, commit));
            }
        }
        refs.sort();
        let mut files = Vec::new();
        if let Ok(snapshots) = std::fs::read_dir(cache.dir.join("snapshots")) {
            for s in snapshots.flatten() {
                let commit = s.file_name().to_string_lossy().into_owned();
                for f in cache.snapshot_files(&commit) {
                    let bytes = std::fs::metadata(cache.snapshot(&commit).join(&f))
                        .map(|m| m.len())
                        .unwrap_or(0);
                    files.push((commit.clone(), f, bytes));
                }
            }
        }
        files.sort();
        let bytes = std::fs::read_dir(cache.dir.join("blobs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|b| !b.file_name().to_string_lossy().ends_with(".incomplete"))
            .filter_map(|b| b.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum();
        repos.push(CachedRepo {
            repo: hub.repo,
            refs,
            files,
            bytes,
        });
    }
    repos.sort_by(|a, b| a.repo.cmp(&b.repo));
    repos
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn links_are_relative_and_refs_whole() {
        let dir = tempfile::tempdir().unwrap();
        let name = HubName::parse("org/model").unwrap();
        let cache = RepoCache::new(dir.path(), &name);
        std::fs::create_dir_all(cache.blob("x").parent().unwrap()).unwrap();
        std::fs::write(cache.blob("etag1"), b"abc").unwrap();
        let link = cache.link(COMMIT, "sub/m.gguf", "etag1").unwrap();
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from("../../../blobs/etag1")
        );
        assert_eq!(std::fs::read(&link).unwrap(), b"abc");
        cache.set_ref("main", COMMIT).unwrap();
        assert_eq!(cache.commit_of("main").as_deref(), Some(COMMIT));
        assert_eq!(cache.commit_of(COMMIT).as_deref(), Some(COMMIT));
        assert_eq!(cache.snapshot_files(COMMIT), ["sub/m.gguf"]);
        let repos = cached_repos(dir.path());
        assert_eq!(repos.len(), 1);
        assert_eq!(repos[0].repo, "org/model");
        assert_eq!(repos[0].refs, [("main".to_string(), COMMIT.to_string())]);
        assert_eq!(repos[0].bytes, 3);
    }
}
