//! Function calling at the edge: a chat request's `tools`, `tool_choice` and
//! `parallel_tool_calls` checked and turned into a [`ToolPlan`]: what the chat template is
//! shown, which format the output is parsed in, and, for `required` or a named function, the
//! grammar that forces a valid call.

use std::sync::Arc;

use serde_json::Value;
use sluice_engine::{FunctionSpec, Grammar};
use sluice_tokenizer::tool_parser::ToolCallFormat;
use sluice_tokenizer::ChatTemplate;

use crate::edge::error::ApiError;
use crate::openai::structured::{Tool, ToolChoice};

/// Longest function name, as OpenAI's.
const MAX_NAME_LEN: usize = 64;
/// Most tools one request may declare (OpenAI's limit).
const MAX_TOOLS: usize = 128;

/// How a chat request's tools shape its prompt, its decoding and its output.
#[derive(Debug, Clone, Default)]
pub struct ToolPlan {
    /// The `tools` array as the chat template receives it; `None` renders no tools.
    pub template_tools: Option<Vec<Value>>,
    /// The output is parsed for calls in this format; `None` leaves it all content.
    pub format: Option<ToolCallFormat>,
    /// The grammar the output follows: a forced call (`required`, a named function), or, for
    /// `auto` with strict tools, text or valid calls.
    pub grammar: Option<Grammar>,
    /// At most one call is returned (`parallel_tool_calls: false`).
    pub single_call: bool,
    /// Under `auto`, the names of the tools offered: an answer that is a call's JSON alone,
    /// without the format's markup, is read as that call.
    pub bare_calls: Option<Arc<[String]>>,
}

/// Checks the tool fields and plans the request. `format_override` is the server's
/// `--tool-call-parser`; otherwise the template's own format is used.
pub fn plan(
    tools: Option<Vec<Value>>,
    choice: Option<ToolChoice>,
    parallel: Option<bool>,
    template: &ChatTemplate,
    format_override: Option<ToolCallFormat>,
) -> Result<ToolPlan, ApiError> {
    // The template sees the tools exactly as the client sent them (key order included), as a
    // Python template would; the typed view is for checking and for the grammar.
    let raw_tools = tools.unwrap_or_default();
    let tools = raw_tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::from_value::<Tool>(t.clone()).map_err(|e| {
                ApiError::invalid(format!("tools[{i}]"), format!("not a valid tool: {e}"))
            })
        })
        .collect::<Result<Vec<Tool>, ApiError>>()?;
    if tools.is_empty() {
        return match choice {
            None | Some(ToolChoice::None) => Ok(ToolPlan::default()),
            Some(_) => Err(ApiError::invalid(
                "tool_choice",
                "tool_choice needs tools; none were given.",
            )),
        };
    }
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "{} tools were given; at most {MAX_TOOLS} are allowed.",
                tools.len()
            ),
        ));
    }
    let mut specs: Vec<FunctionSpec> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!(
                    "tools of type `{}` are not supported; only `function`.",
                    tool.kind
                ),
            ));
        }
        let name = &tool.function.name;
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!(
                    "`{name}` is not a valid function name: use a-z, A-Z, 0-9, _ and -, at \
                     most {MAX_NAME_LEN} characters."
                ),
            ));
        }
        if specs.iter().any(|s| &s.name == name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!("two tools are called `{name}`."),
            ));
        }
        let parameters = match &tool.function.parameters {
            None | Some(Value::Null) => Value::Null,
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    "parameters must be a JSON schema object.",
                ))
            }
        };
        specs.push(FunctionSpec {
            name: name.clone(),
            parameters,
        });
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Function(name) = &choice {
        if !specs.iter().any(|s| &s.name == name) {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names `{name}`, which is not among the tools."),
            ));
        }
    }
    if choice == ToolChoice::None {
        // The model is not to call: it is not shown the tools, and its text is all content.
        return Ok(ToolPlan::default());
    }
    let format = format_override.unwrap_or_else(|| template.tool_call_format());
    let single_call = parallel == Some(false);
    let strict = tools.iter().any(|t| t.function.strict == Some(true));
    // A forced call is valid against its function's schema whatever `strict` says; `strict`
    // only decides whether a schema keyword the grammar engine cannot enforce is a 400 or is
    // left unenforced.
    let grammar = match &choice {
        ToolChoice::Required => Some(Grammar::forced_tool_call(
            format,
            &specs,
            !single_call,
            strict,
        )),
        ToolChoice::Function(name) => {
            let only: Vec<FunctionSpec> =
                specs.iter().filter(|s| &s.name == name).cloned().collect();
            Some(Grammar::forced_tool_call(format, &only, false, strict))
        }
        // Strict tools promise valid calls, so `auto` is constrained too: text, or calls that
        // validate. Without strict the model writes freely and its calls are parsed.
        ToolChoice::Auto if strict => {
            let grammar = Grammar::auto_tool_call(format, &specs, !single_call, strict)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tools",
                        format!(
                            "strict tools with tool_choice \"auto\" need the hermes or openai \
                             (Harmony) call format; this model's is {format}. Use tool_choice \
                             \"required\" or drop strict."
                        ),
                    )
                })?;
            Some(grammar)
        }
        ToolChoice::Auto | ToolChoice::None => None,
    };
    let bare_calls = (choice == ToolChoice::Auto).then(|| {
        specs
            .iter()
            .map(|s| s.name.clone())
            .collect::<Arc<[String]>>()
    });
    Ok(ToolPlan {
        template_tools: Some(raw_tools),
        format: Some(format),
        grammar,
        single_call,
        bare_calls,
    })
}

/// An error of [`plan`] as an API with flat tools (`{"name", "parameters"}` at the top of
/// each tool, as Anthropic's and the Responses API have) names the field: `tools[0].name`
/// for `tools[0].function.name`, and `parameters` as that API calls it.
pub fn flat_tool_param(mut e: ApiError, parameters: &str) -> ApiError {
    if let Some(p) = e.param.as_mut() {
        *p = p
            .replace(".function.parameters", &format!(".{parameters}"))
            .replace(".function.", ".");
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "description": "d",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}})
    }

    fn chatml() -> ChatTemplate {
        ChatTemplate::chatml().unwrap()
    }

    fn param(r: Result<ToolPlan, ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    #[test]
    fn choices_plan_rendering_parsing_and_forcing() {
        let t = chatml();
        let auto = plan(Some(vec![tool("f")]), None, None, &t, None).unwrap();
        assert!(auto.template_tools.is_some() && auto.format.is_some() && auto.grammar.is_none());
        // Under `auto` a bare call's JSON may name the offered tools; forced calls have markup.
        assert_eq!(auto.bare_calls.as_deref(), Some(&["f".to_string()][..]));
        let none = plan(
            Some(vec![tool("f")]),
            Some(ToolChoice::None),
            None,
            &t,
            None,
        )
        .unwrap();
        assert!(none.template_tools.is_none() && none.format.is_none());
        let req = plan(
            Some(vec![tool("f"), tool("g")]),
            Some(ToolChoice::Required),
            None,
            &t,
            None,
        )
        .unwrap();
        assert!(
            matches!(req.grammar, Some(Grammar::Lark(ref l)) if l.contains("\"f\"") && l.contains("\"g\""))
        );
        assert!(req.bare_calls.is_none() && none.bare_calls.is_none());
        let named = plan(
            Some(vec![tool("f"), tool("g")]),
            Some(ToolChoice::Function("g".into())),
            Some(false),
            &t,
            None,
        )
        .unwrap();
        assert!(matches!(named.grammar, Some(Grammar::Lark(ref l)) if !l.contains("\"f\"")));
        assert!(named.single_call);
        let mistral = plan(
            Some(vec![tool("f")]),
            None,
            None,
            &t,
            Some(ToolCallFormat::Mistral),
        )
        .unwrap();
        assert_eq!(mistral.format, Some(ToolCallFormat::Mistral));
        let mut strict = tool("f");
        strict["function"]["strict"] = json!(true);
        let auto = plan(Some(vec![strict.clone()]), None, None, &t, None).unwrap();
        assert!(matches!(auto.grammar, Some(Grammar::Lark(ref l)) if l.contains("lead")));
        let e = plan(
            Some(vec![strict]),
            None,
            None,
            &t,
            Some(ToolCallFormat::Mistral),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools"));
    }

    #[test]
    fn flat_tool_apis_get_their_own_field_names() {
        let e = flat_tool_param(
            ApiError::invalid("tools[0].function.parameters", "x"),
            "input_schema",
        );
        assert_eq!(e.param.as_deref(), Some("tools[0].input_schema"));
        let e = flat_tool_param(
            ApiError::invalid("tools[1].function.name", "x"),
            "parameters",
        );
        assert_eq!(e.param.as_deref(), Some("tools[1].name"));
    }

    #[test]
    fn bad_tools_name_their_field() {
        let t = chatml();
        assert_eq!(
            param(plan(None, Some(ToolChoice::Required), None, &t, None)),
            Some("tool_choice".into())
        );
        assert_eq!(
            param(plan(
                Some(vec![tool("f")]),
                Some(ToolChoice::Function("nope".into())),
                None,
                &t,
                None
            )),
            Some("tool_choice".into())
        );
        assert_eq!(
            param(plan(Some(vec![tool("f"), tool("f")]), None, None, &t, None)),
            Some("tools[1].function.name".into())
        );
        assert_eq!(
            param(plan(Some(vec![tool("has space")]), None, None, &t, None)),
            Some("tools[0].function.name".into())
        );
        let mut bad = tool("f");
        bad["type"] = json!("code_interpreter");
        assert_eq!(
            param(plan(Some(vec![bad]), None, None, &t, None)),
            Some("tools[0].type".into())
        );
        let mut bad = tool("f");
        bad["function"]["parameters"] = json!([1]);
        assert_eq!(
            param(plan(Some(vec![bad]), None, None, &t, None)),
            Some("tools[0].function.parameters".into())
        );
        assert_eq!(
            param(plan(
                Some(vec![json!({"type": "function"})]),
                None,
                None,
                &t,
                None
            )),
            Some("tools[0]".into())
        );
    }
}
