//! `sluice serve`'s configuration: the layers, each key's parsing, and the shipped file.

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

fn args(flags: &[&str]) -> ServeArgs {
    let mut argv = vec!["sluice"];
    argv.extend_from_slice(flags);
    Cli::try_parse_from(argv).unwrap().args
}

#[test]
fn sizes_parse_with_binary_and_decimal_units() {
    let cases = [
        ("512MiB", 512 << 20),
        ("2GiB", 2 << 30),
        ("2gib", 2 << 30),
        ("1048576", 1 << 20),
        ("4M", 4 << 20),
        ("1.5GiB", 3 << 29),
        ("10 KB", 10_000),
        ("7B", 7),
        // Where bytesize differs, sluice keeps what it documents: K/M/G are binary,
        // blanks around the size are trimmed.
        ("4 k", 4 << 10),
        ("1G", 1 << 30),
        (" 2GiB ", 2 << 30),
    ];
    for (text, bytes) in cases {
        assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{text}");
    }
    for bad in [
        "",
        "MiB",
        "12XB",
        "-1",
        "1e999GiB",
        "99999999999999999999GiB",
    ] {
        assert!(bad.parse::<ByteSize>().is_err(), "{bad:?} should not parse");
    }
    assert_eq!(ByteSize(1 << 30).to_string(), "1GiB");
    assert_eq!(ByteSize(1000).to_string(), "1000B");
}

#[test]
fn an_8_bit_kv_cache_is_named_q8_0_everywhere() {
    let c = Config::from_layers(
        None,
        &args(&["--model", "/tmp/x/tiny.gguf", "--kv-cache-dtype", "q8_0"]),
    )
    .unwrap();
    assert_eq!(c.kv_cache_dtype, KvCacheDtype::Q8_0);
    assert_eq!(c.kv_cache_dtype.dtype(), KvDtype::Q8_0);
    // The config file and SLUICE_KV_CACHE_DTYPE spell it the same way.
    assert_eq!(
        serde_json::from_str::<KvCacheDtype>("\"q8_0\"").unwrap(),
        KvCacheDtype::Q8_0
    );
    assert_eq!(
        serde_json::to_string(&KvCacheDtype::Q8_0).unwrap(),
        "\"q8_0\""
    );
}

#[test]
fn defaults_without_file_or_flags() {
    let c = Config::from_layers(None, &ServeArgs::default()).unwrap();
    assert_eq!(
        c.model,
        ModelPaths::paths(vec![PathBuf::from(DEFAULT_MODEL)])
    );
    assert_eq!(c.served_model_name(), "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 8000));
    assert_eq!(*c.weights, WeightsKind::Auto);
    assert_eq!(c.kv_cache_memory, ByteSize(1 << 30));
    assert_eq!(c.kv_cache_dtype, KvCacheDtype::F16);
    assert_eq!(c.block_size, 16);
    assert_eq!(
        (c.max_num_seqs, c.max_num_batched_tokens, c.max_waiting),
        (256, 512, 1024)
    );
    assert_eq!(c.max_model_len, None);
    assert_eq!(c.api_key, None);
    assert!(!c.metrics_require_key);
    assert!(c.cors_origins.0.is_empty());
    assert_eq!(c.body_limit, ByteSize(4 << 20));
    assert_eq!(c.request_timeout(), Duration::from_secs(30));
    assert_eq!(c.log_format, LogFormat::Text);
    assert_eq!(c.webui, Switch::On);
    assert_eq!(c.log_level, "info");
    assert_eq!(c.drain_timeout(), Duration::from_secs(30));
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let file = Some(Toml::string(
        r#"
        port = 9000
        host = "127.0.0.1"
        weights = "f16"
        kv_cache_memory = "256MiB"
        body_limit = 1024
        cors_origins = ["http://a.example", "http://b.example"]
        max_model_len = 512
        api_key = ""
        "#,
    ));
    let c =
        Config::from_layers(file, &args(&["--port", "9100", "--weights", "quantized"])).unwrap();
    let bf16 = Config::from_layers(None, &args(&["--weights", "bf16"])).unwrap();
    assert_eq!(*bf16.weights, WeightsKind::Bf16);
    let exact = Config::from_layers(None, &args(&["--weights", "exact"])).unwrap();
    assert_eq!(*exact.weights, WeightsKind::Exact);
    assert_eq!(c.port, 9100);
    assert_eq!(c.host, "127.0.0.1");
    assert_eq!(*c.weights, WeightsKind::Quantized);
    assert_eq!(c.kv_cache_memory, ByteSize(256 << 20));
    assert_eq!(c.body_limit, ByteSize(1024));
    assert_eq!(c.cors_origins.0, ["http://a.example", "http://b.example"]);
    assert_eq!(c.max_model_len, Some(512));
    assert_eq!(c.api_key, None, "an empty key is no key");

    let c = Config::from_layers(
        None,
        &args(&[
            "--model",
            "/tmp/x/tiny.gguf",
            "--cors-origins",
            "http://a, http://b",
            "--kv-cache-memory",
            "2GiB",
            "--kv-cache-dtype",
            "f32",
            "--log-format",
            "json",
            "--api-key",
            "sk-1",
            "--metrics-require-key",
            "--webui",
            "off",
        ]),
    )
    .unwrap();
    assert!(c.metrics_require_key);
    assert_eq!(c.webui, Switch::Off);
    assert_eq!(c.served_model_name(), "tiny");
    assert_eq!(c.cors_origins.0, ["http://a", "http://b"]);
    assert_eq!(c.kv_cache_memory, ByteSize(2 << 30));
    assert_eq!(c.kv_cache_dtype, KvCacheDtype::F32);
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.api_key.as_ref().map(|k| k.0.as_str()), Some("sk-1"));
    assert!(
        !format!("{c:?}").contains("sk-1"),
        "the key stays out of Debug"
    );
}

#[test]
fn bad_values_are_errors_naming_the_key() {
    let unknown =
        Config::from_layers(Some(Toml::string("prot = 1")), &ServeArgs::default()).unwrap_err();
    assert!(unknown.to_string().contains("prot"), "{unknown}");
    let file = Some(Toml::string("weights = \"f8\""));
    let err = Config::from_layers(file, &ServeArgs::default()).unwrap_err();
    assert!(err.to_string().contains("weights"), "{err}");
    let err = Config::from_layers(None, &args(&["--block-size", "0"])).unwrap_err();
    assert!(err.to_string().contains("block_size"), "{err}");
    assert!(Cli::try_parse_from(["sluice", "--kv-cache-memory", "lots"]).is_err());
    let err = Config::from_layers(None, &args(&["--metrics-require-key"])).unwrap_err();
    assert!(err.to_string().contains("metrics_require_key"), "{err}");
    let file = Some(Toml::string("api_key = \"k\"\nmetrics_require_key = true"));
    let c = Config::from_layers(file, &args(&["--metrics-require-key", "false"])).unwrap();
    assert!(!c.metrics_require_key, "the flag overrides the file");
}

#[test]
fn served_name_defaults_to_the_file_stem_or_the_directory_name() {
    assert_eq!(
        default_served_name(Path::new("models/SmolLM2-135M-Instruct.Q4_1.gguf")),
        "SmolLM2-135M-Instruct.Q4_1"
    );
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("Qwen2.5-0.5B-Instruct");
    std::fs::create_dir(&model).unwrap();
    assert_eq!(default_served_name(&model), "Qwen2.5-0.5B-Instruct");
    let with_slash = PathBuf::from(format!("{}/", model.display()));
    assert_eq!(default_served_name(&with_slash), "Qwen2.5-0.5B-Instruct");
}

#[test]
fn the_tool_call_parser_is_a_known_format() {
    let c = Config::from_layers(None, &args(&["--tool-call-parser", "mistral"])).unwrap();
    assert_eq!(
        c.tool_call_parser.map(|f| *f),
        Some(ToolCallFormat::Mistral)
    );
    let e = Cli::try_parse_from(["sluice", "--tool-call-parser", "xml"])
        .err()
        .expect("an unknown format")
        .to_string();
    assert!(
        e.contains("--tool-call-parser") && e.contains("hermes"),
        "{e}"
    );
    let file = Some(Toml::string("tool_call_parser = \"xml\""));
    let e = Config::from_layers(file, &ServeArgs::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tool_call_parser") && e.contains("hermes"),
        "{e}"
    );
}

#[test]
fn the_pooling_is_a_known_one() {
    let c = Config::from_layers(None, &args(&["--pooling", "last"])).unwrap();
    assert_eq!(c.pooling.map(|p| *p), Some(Pooling::Last));
    let file = Some(Toml::string("pooling = \"max\""));
    let e = Config::from_layers(file, &ServeArgs::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("pooling") && e.contains("mean"), "{e}");
}

#[test]
fn speculation_is_ngram_or_a_draft_model() {
    let c = Config::from_layers(None, &args(&["--speculative", "ngram"])).unwrap();
    assert_eq!(c.speculative.map(|s| s.0), Some(Speculative::Ngram));
    assert_eq!(c.num_speculative_tokens, 8);
    let c =
        Config::from_layers(None, &args(&["--speculative", "draft:models/small.gguf"])).unwrap();
    assert_eq!(
        c.speculative.map(|s| s.0),
        Some(Speculative::DraftModel("models/small.gguf".into()))
    );
    for bad in ["draft:", "medusa"] {
        let e = Cli::try_parse_from(["sluice", "--speculative", bad])
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("--speculative") && e.contains("draft:PATH"),
            "{e}"
        );
    }
    let err = Config::from_layers(None, &args(&["--num-speculative-tokens", "17"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("num_speculative_tokens"), "{err}");
}

/// The flags and the file's keys are the same list: every flag but `--config` is a key of
/// the file (its name with underscores), and every key a flag.
#[test]
fn every_flag_is_a_file_key_and_back() {
    use clap::CommandFactory;
    let flags: Vec<String> = Cli::command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|name| *name != "config")
        .map(|name| name.replace('-', "_"))
        .collect();
    let keys = serde_json::to_value(Config::default()).unwrap();
    let keys: Vec<String> = keys.as_object().unwrap().keys().cloned().collect();
    let (mut flags_sorted, mut keys_sorted) = (flags.clone(), keys.clone());
    flags_sorted.sort();
    keys_sorted.sort();
    assert_eq!(flags_sorted, keys_sorted);
    assert_eq!(flags.len(), 47, "{flags:?}");
}

/// `[[model]]` tables set a model's own name, weights and KV memory; plain entries and the
/// flag take the server's.
#[test]
fn model_tables_set_their_own_name_weights_and_cache() {
    let file = Toml::string(
        r#"
        kv_cache_memory = "256MiB"
        [[model]]
        model = "models/a.gguf"
        [[model]]
        model = "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q8_0"
        served_model_name = "coder"
        weights = "f16"
        kv_cache_memory = "2GiB"
        "#,
    );
    let c = Config::from_layers(Some(file), &ServeArgs::default()).unwrap();
    let models = c.models();
    assert_eq!(models.len(), 2);
    assert_eq!(
        (
            models[0].name.as_str(),
            models[0].weights,
            models[0].kv_cache_memory
        ),
        ("a", WeightsKind::Auto, ByteSize(256 << 20))
    );
    assert_eq!(
        (
            models[1].name.as_str(),
            models[1].weights,
            models[1].kv_cache_memory
        ),
        ("coder", WeightsKind::F16, ByteSize(2 << 30))
    );
    // The flag repeated; two models of one name are refused.
    let c =
        Config::from_layers(None, &args(&["--model", "x/a.gguf", "--model", "y/b.gguf"])).unwrap();
    assert_eq!(c.models().len(), 2, "{:?}", c.model);
    assert_eq!(c.models()[1].name, "b");
    let err = Config::from_layers(None, &args(&["--model", "x/a.gguf", "--model", "y/a.gguf"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("two models or adapters would be served as `a`"),
        "{err}"
    );
}

/// `mmproj` is the default model's tower, a `[[model]]` table's its own; other models have
/// none.
#[test]
fn mmproj_belongs_to_its_model() {
    let c = Config::from_layers(
        None,
        &args(&[
            "--model", "a.gguf", "--model", "b.gguf", "--mmproj", "p.gguf",
        ]),
    )
    .unwrap();
    let towers: Vec<_> = c.models().into_iter().map(|m| m.mmproj).collect();
    assert_eq!(towers, vec![Some("p.gguf".into()), None]);
    let file = Toml::string(
        r#"
        [[model]]
        model = "a.gguf"
        [[model]]
        model = "b.gguf"
        mmproj = "vision.gguf"
        "#,
    );
    let c = Config::from_layers(Some(file), &ServeArgs::default()).unwrap();
    let towers: Vec<_> = c.models().into_iter().map(|m| m.mmproj).collect();
    assert_eq!(towers, vec![None, Some("vision.gguf".into())]);
}

/// A hub name is served as written; a path by its file's stem.
#[test]
fn a_hub_name_is_served_as_written() {
    let c = Config::from_layers(
        None,
        &args(&["--model", "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q8_0"]),
    )
    .unwrap();
    assert_eq!(
        c.served_model_name(),
        "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q8_0"
    );
    assert_eq!(c.revision, "main");
    let c = Config::from_layers(None, &args(&["--model", "models/absent.gguf"])).unwrap();
    assert_eq!(c.served_model_name(), "absent");
}

#[test]
fn the_shipped_config_file_states_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/sluice.toml");
    let file = Some(Toml::file_exact(path));
    let from_file = Config::from_layers(file, &ServeArgs::default()).unwrap();
    let defaults = Config::from_layers(None, &ServeArgs::default()).unwrap();
    assert_eq!(format!("{from_file:?}"), format!("{defaults:?}"));
}
