//! gpt-oss's chat template (the Harmony format: system and developer messages, `reasoning_effort`,
//! tools in the developer message's `functions` namespace, tool calls on the commentary channel)
//! rendered by sluice's minijinja environment equals Python jinja2's rendering, as Hugging
//! Face's `apply_chat_template` does it, for plain chat, turns with a system message, each
//! reasoning effort, tools and tool-call history, with and without the generation prompt
//! (`tests/fixtures/templates/gpt-oss-renders.jsonl`, `scripts/gpt-oss-template-fixture.py`;
//! the template is llama.cpp's copy, MIT). The fixture's date is the one the template is pinned to
//! here (`ChatTemplate::with_date`); unpinned, it prints the host's date.

use serde_json::Value;
use sluice_tokenizer::{ChatMessage, ChatTemplate, RenderOptions, TemplateDate};

fn fixtures() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates")
}

#[test]
fn the_harmony_template_renders_as_jinja2_renders_it() {
    let source = std::fs::read_to_string(fixtures().join("openai-gpt-oss-120b.jinja")).unwrap();
    let template = ChatTemplate::new(&source, Some("<|startoftext|>"), Some("<|return|>"))
        .unwrap()
        .with_date("2026-01-02".parse().unwrap());
    assert!(template.renders_tools() && template.reads("reasoning_effort"));
    assert!(template.reads_date());
    let rows = std::fs::read_to_string(fixtures().join("gpt-oss-renders.jsonl")).unwrap();
    let mut checked = 0;
    for line in rows.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_value(row["messages"].clone()).unwrap();
        let tools = row["tools"].as_array().cloned();
        let kwargs = row["kwargs"].as_object().cloned();
        let options = RenderOptions {
            add_generation_prompt: row["add_generation_prompt"].as_bool().unwrap(),
            tools: tools.as_deref(),
            kwargs: kwargs.as_ref(),
        };
        let got = template.render_with(&messages, &options).unwrap();
        let want = row["text"].as_str().unwrap();
        assert_eq!(
            got, want,
            "case {} ({})",
            row["name"], options.add_generation_prompt
        );
        checked += 1;
    }
    assert_eq!(checked, 12);
}

/// Unpinned, the template prints the host's local date (read before and after the render, so
/// a render across midnight passes too).
#[test]
fn the_unpinned_template_prints_the_hosts_date() {
    let source = std::fs::read_to_string(fixtures().join("openai-gpt-oss-120b.jinja")).unwrap();
    let template = ChatTemplate::new(&source, None, None).unwrap();
    assert_eq!(template.date(), TemplateDate::Today);
    let today = || chrono::Local::now().format("%Y-%m-%d").to_string();
    let before = today();
    let text = template
        .render(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    let after = today();
    assert!(
        text.contains(&format!("Current date: {before}\n"))
            || text.contains(&format!("Current date: {after}\n")),
        "{text}"
    );
}
