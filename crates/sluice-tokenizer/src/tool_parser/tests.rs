use super::*;
use ToolCallFormat::{Hermes, Llama3Json, Mistral};

/// Joins neighbouring events of the same kind, as a client joins streamed deltas.
fn merged(events: Vec<ToolEvent>) -> Vec<ToolEvent> {
    let mut out: Vec<ToolEvent> = Vec::new();
    for event in events {
        match (out.last_mut(), event) {
            (Some(ToolEvent::Content(last)), ToolEvent::Content(text)) => last.push_str(&text),
            (
                Some(ToolEvent::CallArguments {
                    index: last_index,
                    fragment: last,
                }),
                ToolEvent::CallArguments { index, fragment },
            ) if *last_index == index => last.push_str(&fragment),
            (_, event) => out.push(event),
        }
    }
    out
}

fn parse_chunks<'a>(
    format: ToolCallFormat,
    chunks: impl IntoIterator<Item = &'a str>,
) -> Vec<ToolEvent> {
    let mut parser = format.parser();
    let mut out = Vec::new();
    for chunk in chunks {
        parser.push(chunk, &mut out);
    }
    parser.finish(&mut out);
    merged(out)
}

/// Parses `text` whole, then checks that one character at a time, every split in two and
/// many random chunkings give the same events; returns them.
fn parse(format: ToolCallFormat, text: &str) -> Vec<ToolEvent> {
    let whole = parse_chunks(format, [text]);
    let boundaries: Vec<usize> = text.char_indices().map(|(at, _)| at).skip(1).collect();
    let chars: Vec<String> = text.chars().map(String::from).collect();
    assert_eq!(
        parse_chunks(format, chars.iter().map(String::as_str)),
        whole,
        "by character: {text:?}"
    );
    for &at in &boundaries {
        let halves = [&text[..at], &text[at..]];
        assert_eq!(
            parse_chunks(format, halves),
            whole,
            "split at {at}: {text:?}"
        );
    }
    let mut seed = 0x9e37_79b9_u64;
    for _ in 0..50 {
        let mut cuts: Vec<usize> = boundaries
            .iter()
            .copied()
            .filter(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                seed >> 62 == 0
            })
            .collect();
        cuts.insert(0, 0);
        cuts.push(text.len());
        let chunks = cuts.windows(2).map(|w| &text[w[0]..w[1]]);
        assert_eq!(
            parse_chunks(format, chunks),
            whole,
            "cuts {cuts:?}: {text:?}"
        );
    }
    whole
}

fn content(text: &str) -> ToolEvent {
    ToolEvent::Content(text.to_string())
}

fn call(index: usize, name: &str, arguments: &str) -> [ToolEvent; 2] {
    [
        ToolEvent::CallStart {
            index,
            name: name.to_string(),
        },
        ToolEvent::CallArguments {
            index,
            fragment: arguments.to_string(),
        },
    ]
}

fn events<const N: usize>(groups: [&[ToolEvent]; N]) -> Vec<ToolEvent> {
    groups.iter().flat_map(|g| g.iter().cloned()).collect()
}

#[test]
fn names_round_trip_and_templates_are_recognized() {
    for (format, name) in ToolCallFormat::ALL.iter().zip(ToolCallFormat::NAMES) {
        assert_eq!(ToolCallFormat::from_name(name), Some(*format));
        assert_eq!(format.name(), name);
    }
    assert_eq!(ToolCallFormat::from_name("pythonic"), None);
    let qwen = "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\nFor each function call, return a json object within <tool_call></tool_call>";
    assert_eq!(ToolCallFormat::detect(qwen), Some(Hermes));
    assert_eq!(
        ToolCallFormat::detect(
            "{{ '[AVAILABLE_TOOLS]' }}{% if m.tool_calls %}[TOOL_CALLS][{% endif %}"
        ),
        Some(Mistral)
    );
    let llama = "{{- '<|start_header_id|>ipython<|end_header_id|>' }} Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.";
    assert_eq!(ToolCallFormat::detect(llama), Some(Llama3Json));
    assert_eq!(
        ToolCallFormat::detect("{{ '<|python_tag|>' }}"),
        Some(Llama3Json)
    );
    assert_eq!(
        ToolCallFormat::detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
        None
    );
}

#[test]
fn hermes_calls_are_split_from_content() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich \\\"}{\", \"n\": [1, {\"x\": null}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>\n";
    assert_eq!(
        parse(Hermes, text),
        events([
            &[content("Let me check.")],
            &call(
                0,
                "get_weather",
                "{\"city\": \"Zürich \\\"}{\", \"n\": [1, {\"x\": null}]}"
            ),
            &call(1, "time", "{}"),
        ])
    );
}

#[test]
fn content_streams_until_it_could_be_a_marker() {
    let mut parser = Hermes.parser();
    let mut out = Vec::new();
    parser.push("Hello a<b, <tool_", &mut out);
    assert_eq!(out, vec![content("Hello a<b,")]);
    out.clear();
    parser.push("call>\n{\"name\": \"f\", \"arguments\": {\"a\": ", &mut out);
    assert_eq!(
        out,
        vec![
            ToolEvent::CallStart {
                index: 0,
                name: "f".into()
            },
            ToolEvent::CallArguments {
                index: 0,
                fragment: "{\"a\": ".into()
            },
        ]
    );
    out.clear();
    parser.push("1}}\n</tool_call>", &mut out);
    parser.finish(&mut out);
    assert_eq!(
        out,
        vec![ToolEvent::CallArguments {
            index: 0,
            fragment: "1}".into()
        }]
    );
    // A '<' that does not become a marker is content, whitespace included.
    assert_eq!(
        parse(Hermes, "a <b> <tool c\n"),
        vec![content("a <b> <tool c\n")]
    );
    assert_eq!(
        parse(Hermes, "ends with <tool_"),
        vec![content("ends with <tool_")]
    );
}

#[test]
fn arguments_before_name_and_arguments_as_a_string_are_read() {
    assert_eq!(
        parse(
            Hermes,
            "<tool_call>{\"arguments\": {\"x\": \"{\"}, \"name\": \"f\"}</tool_call>"
        ),
        call(0, "f", "{\"x\": \"{\"}").to_vec()
    );
    assert_eq!(
        parse(
            Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>"
        ),
        call(0, "f", "{\"x\": 1}").to_vec()
    );
    // Unknown keys are skipped; a call without arguments has an empty object.
    assert_eq!(
            parse(Hermes, "<tool_call>{\"id\": 7, \"type\": \"function\", \"name\": \"n\\u00e9\", \"extra\": [1, \"]\"]}</tool_call>"),
            call(0, "né", "{}").to_vec()
        );
}

#[test]
fn text_after_calls_is_content_unless_only_whitespace() {
    assert_eq!(
        parse(
            Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nDone, see above.\n"
        ),
        events([&call(0, "f", "{}"), &[content("Done, see above.\n")]])
    );
    assert_eq!(
        parse(
            Hermes,
            "  \n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>  \n "
        ),
        call(0, "f", "{}").to_vec()
    );
}

#[test]
fn malformed_calls_before_their_start_are_given_back_as_content() {
    for text in [
        "<tool_call>\nnot json",
        "<tool_call>{\"na",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "Sure <tool_call> {\"name\": 3}",
    ] {
        let got = parse(Hermes, text);
        let joined: String = got
            .iter()
            .map(|e| match e {
                ToolEvent::Content(t) => t.as_str(),
                other => panic!("{other:?} in {text:?}"),
            })
            .collect();
        // Whitespace just before the marker is the only text that may go.
        assert_eq!(joined.replace(' ', ""), text.replace(' ', ""), "{text:?}");
    }
}

#[test]
fn a_started_call_stays_started_when_the_text_breaks_off() {
    // Cut at the token limit: the arguments given out are all there is.
    assert_eq!(
        parse(
            Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2"
        ),
        call(0, "f", "{\"a\": [1, 2").to_vec()
    );
    // Nonsense inside a started Hermes call is dropped up to the closing tag.
    assert_eq!(
        parse(Hermes, "<tool_call>{\"name\": \"f\" oops}</tool_call>after"),
        vec![
            ToolEvent::CallStart {
                index: 0,
                name: "f".into()
            },
            content("after"),
        ]
    );
}

#[test]
fn llama3_json_calls_with_and_without_python_tag() {
    let expected = events([
        &call(0, "f", "{\"a\": [1, {\"b\": \"}\"}]}"),
        &call(1, "g", "{}"),
    ]);
    for text in [
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": \"}\"}]}}; {\"name\": \"g\", \"parameters\": {}}",
            "\n{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": \"}\"}]}};{\"name\": \"g\", \"arguments\": {}}",
            "{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": \"}\"}]}}\n{\"name\": \"g\"}",
        ] {
            assert_eq!(parse(Llama3Json, text), expected, "{text:?}");
        }
    // JSON that is no call, and JSON after words, are content.
    assert_eq!(
        parse(Llama3Json, "{\"result\": 5}\n"),
        vec![content("{\"result\": 5}\n")]
    );
    assert_eq!(
        parse(Llama3Json, "I would call {\"name\": \"f\"}"),
        vec![content("I would call {\"name\": \"f\"}")]
    );
    assert_eq!(
        parse(Llama3Json, "  { not json"),
        vec![content("{ not json")]
    );
}

#[test]
fn mistral_calls_in_every_form() {
    let expected = events([&call(0, "f", "{\"a\": \"é\"}"), &call(1, "g", "{}")]);
    for text in [
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": \"é\"}}, {\"name\": \"g\", \"arguments\": {}}]",
            "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"é\"}, \"id\": \"abc123def\"},{\"name\": \"g\"}]",
            // `[TOOL_CALLS]` is a control token: decoding may have dropped it.
            "[{\"name\": \"f\", \"arguments\": {\"a\": \"é\"}}, {\"name\": \"g\", \"arguments\": {}}]",
            "[TOOL_CALLS]f[ARGS]{\"a\": \"é\"}[TOOL_CALLS]g[ARGS]{}",
            "[TOOL_CALLS]f[CALL_ID]abc123def[ARGS]{\"a\": \"é\"}[TOOL_CALLS]g[ARGS]{}",
        ] {
            assert_eq!(parse(Mistral, text), expected, "{text:?}");
        }
    assert_eq!(
        parse(Mistral, "Hi [TOOL_CALLS]f[ARGS]{}"),
        events([&[content("Hi")], &call(0, "f", "{}")])
    );
    assert_eq!(
        parse(Mistral, "[1, 2] are [TOOL"),
        vec![content("[1, 2] are [TOOL")]
    );
    assert_eq!(parse(Mistral, "[\"x\"]"), vec![content("[\"x\"]")]);
}

fn with_bare<'a>(
    format: ToolCallFormat,
    chunks: impl IntoIterator<Item = &'a str>,
) -> (Vec<ToolEvent>, usize) {
    let offered: Arc<[String]> = vec!["write".to_string()].into();
    let mut parser = format.parser().with_bare_calls(offered);
    let mut out = Vec::new();
    let mut before_finish = 0;
    for chunk in chunks {
        parser.push(chunk, &mut out);
        before_finish = out.len();
    }
    parser.finish(&mut out);
    (merged(out), before_finish)
}

/// A Hermes answer that is a call's JSON alone is that call, given out at the end (until
/// then it could still turn out to be text); with markup, or as text, it reads as ever.
#[test]
fn hermes_reads_a_bare_call_when_tools_were_offered() {
    let bare = "{\"name\": \"write\", \"arguments\": {\"content\": \"hello\"}}";
    let chars: Vec<String> = bare.chars().map(String::from).collect();
    let (events, streamed) = with_bare(Hermes, chars.iter().map(String::as_str));
    assert_eq!(streamed, 0, "nothing is given out while it may be a call");
    assert_eq!(
        events,
        vec![
            ToolEvent::CallStart {
                index: 0,
                name: "write".into()
            },
            ToolEvent::CallArguments {
                index: 0,
                fragment: "{\"content\": \"hello\"}".into()
            },
        ]
    );
    // Without the offer the same text is content.
    assert_eq!(parse(Hermes, bare), vec![content(bare)]);
    // A tagged call and plain text are unchanged, and text streams at once.
    let tagged = format!("<tool_call>\n{bare}\n</tool_call>");
    assert_eq!(
        with_bare(Hermes, [tagged.as_str()]).0,
        parse(Hermes, &tagged)
    );
    let (events, streamed) = with_bare(Hermes, ["The answer", " is 4."]);
    assert_eq!(events, vec![content("The answer is 4.")]);
    assert!(streamed > 0);
    // JSON that is not a call is content, released at its first key.
    let (events, streamed) = with_bare(Hermes, ["{\"answer\"", ": 4}"]);
    assert_eq!(events, vec![content("{\"answer\": 4}")]);
    assert!(streamed > 0);
}

/// Llama 3 reads a bare `{` as its own format does (streaming the call); Harmony reads no
/// bare calls.
#[test]
fn formats_that_read_bare_json_keep_their_own_reading() {
    let bare = "{\"name\": \"write\", \"parameters\": {\"content\": \"hi\"}}";
    let (events, streamed) = with_bare(Llama3Json, [bare]);
    assert_eq!(events, parse(Llama3Json, bare));
    assert!(streamed > 0);
    let (events, _) = with_bare(ToolCallFormat::Harmony, [bare]);
    assert_eq!(events, parse(ToolCallFormat::Harmony, bare));
}
