//! `sluice pull ORG/NAME[:QUANT]` (fetch a model into the Hugging Face cache, nothing else) and
//! `sluice models` (what that cache holds, with sizes).

use std::path::PathBuf;

use anyhow::Context;
use sluice_hub::{cached_repos, HubName, HubSettings};

use crate::engine::hub;

#[derive(clap::Args)]
pub struct PullArgs {
    /// The model: `ORG/NAME` or `ORG/NAME:QUANT` (a GGUF repository's quant; default Q4_K_M,
    /// else its only GGUF).
    #[arg(value_name = "ORG/NAME[:QUANT]")]
    model: String,
    /// Branch, tag or commit to fetch.
    #[arg(long, default_value = sluice_hub::DEFAULT_REVISION, value_name = "REV")]
    revision: String,
}

/// Prints the path a `--model` of this name loads (the file, or the snapshot folder).
pub fn pull(args: PullArgs) -> anyhow::Result<()> {
    let Some(name) = HubName::parse(&args.model) else {
        anyhow::bail!(
            "{:?} is not a hub name: write ORG/NAME or ORG/NAME:QUANT",
            args.model
        );
    };
    let path = hub::resolve_blocking(&PathBuf::from(name.to_string()), &args.revision)?;
    println!("{}", path.display());
    Ok(())
}

#[derive(clap::Args)]
pub struct ModelsArgs {
    /// One JSON object a repository, a line each, instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn models(args: ModelsArgs) -> anyhow::Result<()> {
    let settings = HubSettings::from_env();
    let repos = cached_repos(&settings.cache_dir);
    if args.json {
        for r in &repos {
            let line = serde_json::json!({
                "model": r.repo,
                "bytes": r.bytes,
                "refs": r.refs.iter().map(|(rev, commit)| serde_json::json!({"revision": rev, "commit": commit})).collect::<Vec<_>>(),
                "files": r.files.iter().map(|(commit, file, bytes)| serde_json::json!({"commit": commit, "file": file, "bytes": bytes})).collect::<Vec<_>>(),
            });
            println!("{line}");
        }
        return Ok(());
    }
    if repos.is_empty() {
        eprintln!(
            "the Hugging Face cache {} holds no model (sluice pull ORG/NAME fetches one)",
            settings.cache_dir.display()
        );
        return Ok(());
    }
    let width = repos.iter().map(|r| r.repo.len()).max().unwrap_or(0).max(5);
    println!("{:width$}  {:>10}  FILES", "MODEL", "SIZE");
    for r in &repos {
        let mut files: Vec<&str> = r
            .files
            .iter()
            .map(|(_, f, _)| f.as_str())
            .filter(|f| f.ends_with(".gguf") || f.ends_with(".safetensors"))
            .collect();
        files.dedup();
        let files = if files.is_empty() {
            format!("{} files", r.files.len())
        } else {
            files.join(", ")
        };
        println!(
            "{:width$}  {:>10}  {files}",
            r.repo,
            bytesize::ByteSize(r.bytes).to_string()
        );
    }
    println!(
        "(in {})",
        settings
            .cache_dir
            .canonicalize()
            .with_context(|| format!("cannot read {}", settings.cache_dir.display()))?
            .display()
    );
    Ok(())
}
