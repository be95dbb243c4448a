//! The forced-call grammars compile in llguidance, accept a call written the way the model
//! would write it, refuse one that breaks the tool's schema, and what they accept parses back
//! to the same call. llguidance is what the engine constrains sampling with; here it runs over
//! a byte-level vocabulary, one token per byte.

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use sluice_engine::{FunctionSpec, Grammar};
use sluice_tokenizer::{ToolCallFormat, ToolEvent};
use toktrie::ApproximateTokEnv;

fn tools() -> Vec<FunctionSpec> {
    vec![
        FunctionSpec {
            name: "get_weather".into(),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
                "additionalProperties": false,
            }),
        },
        FunctionSpec {
            name: "now".into(),
            parameters: Value::Null,
        },
    ]
}

/// The Lark text of a forced-call grammar.
fn forced(format: ToolCallFormat, tools: &[FunctionSpec], parallel: bool, strict: bool) -> String {
    lark(Grammar::forced_tool_call(format, tools, parallel, strict))
}

/// The Lark text of an auto-call grammar, if the format has one.
fn auto(
    format: ToolCallFormat,
    tools: &[FunctionSpec],
    parallel: bool,
    strict: bool,
) -> Option<String> {
    Grammar::auto_tool_call(format, tools, parallel, strict).map(lark)
}

fn lark(grammar: Grammar) -> String {
    match grammar {
        Grammar::Lark(text) => text,
        other => panic!("a tool-call grammar is Lark, got {other:?}"),
    }
}

fn factory() -> ParserFactory {
    let env = ApproximateTokEnv::single_byte_env();
    let mut factory = ParserFactory::new_simple(&env).unwrap();
    factory.quiet();
    factory
}

/// Whether `grammar` accepts exactly `text`: every byte allowed in turn, and the grammar
/// complete at the end.
fn accepts(factory: &ParserFactory, grammar: &str, text: &str) -> bool {
    let parser = factory.create_parser(TopLevelGrammar::from_lark(grammar.to_string()));
    let mut matcher = Matcher::new(parser);
    assert!(!matcher.is_error(), "{grammar}: {:?}", matcher.get_error());
    // In the single-byte vocabulary, byte b is token b.
    let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
    match matcher.try_consume_tokens(&tokens) {
        Ok(taken) if taken == tokens.len() => matcher.is_accepting().unwrap_or(false),
        _ => false,
    }
}

fn parsed(format: ToolCallFormat, text: &str) -> Vec<(String, Value)> {
    let mut parser = format.parser();
    let mut events = Vec::new();
    parser.push(text, &mut events);
    parser.finish(&mut events);
    let mut calls: Vec<(String, String)> = Vec::new();
    for event in events {
        match event {
            ToolEvent::CallStart { index, name } => {
                assert_eq!(index, calls.len());
                calls.push((name, String::new()));
            }
            ToolEvent::CallArguments { index, fragment } => calls[index].1.push_str(&fragment),
            ToolEvent::Content(text) | ToolEvent::Reasoning(text) => {
                panic!("text {text:?} in a forced call")
            }
        }
    }
    calls
        .into_iter()
        .map(|(name, arguments)| (name, serde_json::from_str(&arguments).unwrap()))
        .collect()
}

#[test]
fn forced_calls_compile_accept_valid_calls_and_parse_back() {
    let factory = factory();
    let tools = tools();
    let weather = (
        "get_weather".to_string(),
        json!({"city": "Zürich", "days": 2}),
    );
    let now = ("now".to_string(), json!({}));
    let cases = [
        (
            ToolCallFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n</tool_call>",
            "\n",
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
        ),
        (
            ToolCallFormat::Llama3Json,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\", \"days\": 2}}",
            "; ",
            "{\"name\": \"now\", \"parameters\": {}}",
        ),
    ];
    for (format, first, separator, second) in cases {
        let single = forced(format, &tools, false, true);
        assert!(accepts(&factory, &single, first), "{format}: {single}");
        assert_eq!(parsed(format, first), vec![weather.clone()]);
        let both = format!("{first}{separator}{second}");
        assert!(
            !accepts(&factory, &single, &both),
            "{format}: one call only"
        );
        let parallel = forced(format, &tools, true, true);
        assert!(accepts(&factory, &parallel, &both), "{format}: {parallel}");
        assert!(accepts(&factory, &parallel, first), "{format}");
        assert_eq!(parsed(format, &both), vec![weather.clone(), now.clone()]);
    }

    let mistral_one = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}]";
    let mistral_two = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}, {\"name\": \"now\", \"arguments\": {}}]";
    let single = forced(ToolCallFormat::Mistral, &tools, false, true);
    let parallel = forced(ToolCallFormat::Mistral, &tools, true, true);
    assert!(accepts(&factory, &single, mistral_one), "{single}");
    assert!(!accepts(&factory, &single, mistral_two));
    assert!(accepts(&factory, &parallel, mistral_two), "{parallel}");
    assert_eq!(
        parsed(ToolCallFormat::Mistral, mistral_one),
        vec![weather.clone()]
    );
    assert_eq!(
        parsed(ToolCallFormat::Mistral, mistral_two),
        vec![weather, now]
    );
}

#[test]
fn forced_calls_refuse_unknown_tools_bad_arguments_and_arguments_first() {
    let factory = factory();
    let grammar = forced(ToolCallFormat::Hermes, &tools(), false, true);
    for wrong in [
        // No such tool.
        "<tool_call>\n{\"name\": \"delete_all\", \"arguments\": {}}\n</tool_call>",
        // `city` is required, `days` an integer.
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\", \"days\": \"2\"}}\n</tool_call>",
        // The name must come first, so a stream can announce the call early.
        "<tool_call>\n{\"arguments\": {}, \"name\": \"now\"}\n</tool_call>",
        // Text around the call.
        "Sure. <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
    ] {
        assert!(!accepts(&factory, &grammar, wrong), "accepted {wrong}");
    }
}

#[test]
fn a_grammar_without_tools_takes_any_named_call() {
    let factory = factory();
    let grammar = forced(ToolCallFormat::Hermes, &[], false, true);
    let text = "<tool_call>\n{\"name\": \"anything\", \"arguments\": {\"x\": [1]}}\n</tool_call>";
    assert!(accepts(&factory, &grammar, text), "{grammar}");
}

#[test]
fn the_strict_auto_grammar_allows_text_or_valid_calls_only() {
    let factory = factory();
    let tools = tools();
    let grammar = auto(ToolCallFormat::Hermes, &tools, true, true).expect("Hermes has one");
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    for ok in [
        "It is sunny <b>today</b>, no call needed.".to_string(),
        call.to_string(),
        format!("Let me look that up. {call}"),
        format!("{call}\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>"),
    ] {
        assert!(accepts(&factory, &grammar, &ok), "{ok}");
    }
    for bad in [
        "Checking. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Oslo\"}}\n</tool_call>".to_string(),
        "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>".to_string(),
        format!("{call} and some trailing words"),
    ] {
        assert!(!accepts(&factory, &grammar, &bad), "{bad}");
    }
    let single = auto(ToolCallFormat::Hermes, &tools, false, true).unwrap();
    assert!(!accepts(&factory, &single, &format!("{call}\n{call}")));
    assert!(auto(ToolCallFormat::Mistral, &tools, true, true).is_none());
}
