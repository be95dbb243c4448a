//! The grammars of tool calls: one call (or several) in a model's own call format, forced
//! (`tool_choice: "required"` or a named function) or allowed after text (`"auto"` with strict
//! tools), each call naming a tool and its arguments valid against that tool's schema.

use serde_json::{json, Value};
use sluice_tokenizer::ToolCallFormat;

use super::{json_layout, Grammar};

/// A function the model may call, as a tool-call grammar needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    pub name: String,
    /// The JSON schema of the arguments object; `Value::Null` when the tool declares none.
    pub parameters: Value,
}

impl FunctionSpec {
    /// The function of an OpenAI tool (`{"type": "function", "function": {"name": ...,
    /// "parameters": {...}}}`); `None` when it has no function name.
    pub fn from_openai_tool(tool: &Value) -> Option<Self> {
        let function = tool.get("function")?;
        Some(Self {
            name: function.get("name")?.as_str()?.to_string(),
            parameters: function.get("parameters").cloned().unwrap_or(Value::Null),
        })
    }
}

impl Grammar {
    /// A grammar in llguidance's Lark dialect accepting exactly one call in `format` (or,
    /// with `parallel`, one or more), where the call object names one of `tools` and its
    /// arguments validate against that tool's parameter schema. The name comes first, so a
    /// streaming client sees it before the arguments. JSON inside is laid out as Python's
    /// `json.dumps` does (`", "`, `": "`), the way these models were trained to write calls.
    /// With no tools, any name and any arguments object are accepted. `strict` (OpenAI's
    /// flag on a function): a schema keyword the grammar engine cannot enforce makes the
    /// grammar fail to compile; without it such a keyword is left unenforced.
    pub fn forced_tool_call(
        format: ToolCallFormat,
        tools: &[FunctionSpec],
        parallel: bool,
        strict: bool,
    ) -> Self {
        if format == ToolCallFormat::Harmony {
            return Self::Lark(format!("start: call\n{}", harmony_calls(tools, strict)));
        }
        let schema = call_object_schema(format, tools, strict);
        let (call, separator, prefix, suffix) = match format {
            ToolCallFormat::Hermes => (
                format!("\"<tool_call>\\n\" %json {schema} \"\\n</tool_call>\""),
                "\"\\n\"",
                "",
                "",
            ),
            ToolCallFormat::Llama3Json => (format!("%json {schema}"), "\"; \"", "", ""),
            ToolCallFormat::Harmony => unreachable!("Harmony returned above"),
            ToolCallFormat::Mistral => (
                format!("%json {schema}"),
                "\", \"",
                "\"[TOOL_CALLS][\" ",
                " \"]\"",
            ),
        };
        let calls = if parallel {
            format!("call ({separator} call)*")
        } else {
            "call".to_string()
        };
        Self::Lark(format!("start: {prefix}{calls}{suffix}\ncall: {call}\n"))
    }

    /// For `tool_choice: "auto"` with strict tools: a grammar that lets the model either
    /// answer in text (never containing a call marker) or write text and then calls, each of
    /// which names a tool and validates against its schema. `None` for formats whose calls
    /// open with a control token (Llama 3's `<|python_tag|>`, Mistral's `[TOOL_CALLS]`),
    /// which a text grammar cannot spell.
    pub fn auto_tool_call(
        format: ToolCallFormat,
        tools: &[FunctionSpec],
        parallel: bool,
        strict: bool,
    ) -> Option<Self> {
        if format == ToolCallFormat::Harmony {
            // Reasoning first if the model wants, then the answer or a call. The free texts
            // end where a control token comes, which text can never spell.
            return Some(Self::Lark(format!(
                "start: analysis? (answer | call)\n\
                 analysis: <|channel|> \"analysis\" <|message|> /(?s:.*)/ <|end|> <|start|> \"assistant\"\n\
                 answer: <|channel|> \"final\" <|message|> /(?s:.*)/\n\
                 {}",
                harmony_calls(tools, strict)
            )));
        }
        if format != ToolCallFormat::Hermes {
            return None;
        }
        let schema = call_object_schema(format, tools, strict);
        let more = if parallel { " more*" } else { "" };
        // `lead` is lazy with the opening marker as its suffix: it ends at the first
        // `<tool_call>`, where a greedy text lexeme would run past it. `TEXT` is a whole answer
        // without any call.
        Some(Self::Lark(format!(
            "start: TEXT | lead body{more}\n\
             more: \"\\n<tool_call>\\n\" body\n\
             body: %json {schema} \"\\n</tool_call>\"\n\
             lead[suffix=\"<tool_call>\\n\"]: /(?s:.*)/\n\
             TEXT: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/\n"
        )))
    }
}

/// The `call` rule of Harmony (gpt-oss): one message on the `commentary` channel addressed to
/// `functions.NAME`, its body the arguments, valid against that tool's schema. One call only:
/// `<|call|>` after it ends the turn (it is an end-of-generation token), as the model was
/// trained. With no tools, any name and any arguments object.
fn harmony_calls(tools: &[FunctionSpec], strict: bool) -> String {
    let header = |name: &str| {
        // A JSON string literal is a valid Lark string literal, whatever the name holds.
        let recipient = Value::String(format!("commentary to=functions.{name} "));
        format!("<|channel|> {recipient} <|constrain|> \"json\" <|message|>")
    };
    let arguments = |parameters: &Value| {
        let mut schema = match parameters {
            Value::Null => json!({"type": "object"}),
            parameters => parameters.clone(),
        };
        if let Value::Object(fields) = &mut schema {
            fields
                .entry("x-guidance")
                .or_insert_with(|| json_layout(strict));
        }
        format!("%json {schema}")
    };
    if tools.is_empty() {
        return format!(
            "call: <|channel|> \"commentary to=functions.\" NAME \" \" <|constrain|> \"json\" <|message|> {}\n\
             NAME: /[A-Za-z0-9_-]{{1,64}}/\n",
            arguments(&Value::Null)
        );
    }
    let rules: Vec<String> = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            format!(
                "call_{i}: {} {}\n",
                header(&tool.name),
                arguments(&tool.parameters)
            )
        })
        .collect();
    let alternatives: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    format!("call: {}\n{}", alternatives.join(" | "), rules.concat())
}

/// The key under which the model writes a call's arguments when its output is forced.
fn arguments_key(format: ToolCallFormat) -> &'static str {
    match format {
        // Llama 3.1's template asks for "parameters"; the parser takes either.
        ToolCallFormat::Llama3Json => "parameters",
        ToolCallFormat::Hermes | ToolCallFormat::Mistral | ToolCallFormat::Harmony => "arguments",
    }
}

/// The schema of one call object: the name first, then arguments valid against that
/// tool's parameters (one `anyOf` branch per tool; any name and object with no tools).
/// JSON inside is laid out as Python's `json.dumps` does (`", "`, `": "`), the way these
/// models were trained to write calls, with no free whitespace to loop on.
fn call_object_schema(format: ToolCallFormat, tools: &[FunctionSpec], strict: bool) -> Value {
    let arguments_key = arguments_key(format);
    let call_schemas: Vec<Value> = if tools.is_empty() {
        vec![call_schema(
            arguments_key,
            json!({"type": "string"}),
            json!({"type": "object"}),
        )]
    } else {
        tools
            .iter()
            .map(|tool| {
                let parameters = match &tool.parameters {
                    Value::Null => json!({"type": "object"}),
                    parameters => parameters.clone(),
                };
                call_schema(arguments_key, json!({ "const": tool.name }), parameters)
            })
            .collect()
    };
    json!({
        "anyOf": call_schemas,
        "x-guidance": json_layout(strict),
    })
}

/// The schema of one call object naming the function `name_schema` allows.
fn call_schema(arguments_key: &str, name_schema: Value, parameters: Value) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert("name".to_string(), name_schema);
    properties.insert(arguments_key.to_string(), parameters);
    json!({
        "type": "object",
        "properties": properties,
        "required": ["name", arguments_key],
        "additionalProperties": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ToolCallFormat::{Hermes, Llama3Json, Mistral};

    fn lark(grammar: Grammar) -> String {
        match grammar {
            Grammar::Lark(text) => text,
            other => panic!("not Lark: {other:?}"),
        }
    }

    #[test]
    fn grammars_name_each_tool_with_its_parameters() {
        let tools = [
            FunctionSpec {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            },
            FunctionSpec {
                name: "now".into(),
                parameters: Value::Null,
            },
        ];
        let grammar = lark(Grammar::forced_tool_call(Hermes, &tools, false, true));
        assert!(
            grammar.starts_with("start: call\ncall: \"<tool_call>\\n\" %json {"),
            "{grammar}"
        );
        assert!(
            grammar.contains(r#"{"const":"get_weather"}"#)
                && grammar.contains(r#""arguments":{"type":"object"}"#)
        );
        assert!(
            lark(Grammar::forced_tool_call(Llama3Json, &tools, true, true))
                .contains("start: call (\"; \" call)*")
        );
        assert!(lark(Grammar::forced_tool_call(Mistral, &tools, true, true))
            .starts_with("start: \"[TOOL_CALLS][\" call (\", \" call)* \"]\""));
        assert_eq!(
            FunctionSpec::from_openai_tool(
                &json!({"type": "function", "function": {"name": "now"}})
            ),
            Some(tools[1].clone())
        );
    }
}
