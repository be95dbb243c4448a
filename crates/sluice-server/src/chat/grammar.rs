//! Structured outputs at the edge: a request's `response_format`, `structured_outputs` or
//! `guided_*` field becomes one [`Grammar`] (naming the field it came from, for the 400 a bad
//! one gets), and the body's other fields are checked: an OpenAI feature sluice does not
//! serve is refused by name, anything else is named in a debug log line.

use serde_json::Value;
use sluice_engine::Grammar;

use crate::edge::error::ApiError;
pub use crate::openai::structured::ConstraintFields;
use crate::openai::structured::{ResponseFormat, StructuredOutputs};

/// A grammar and the request field it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedGrammar {
    pub grammar: Grammar,
    pub param: &'static str,
}

/// The one grammar the fields ask for, if any. Two constraints at once are a 400: which one
/// would win is not something a client should have to guess.
pub fn requested_grammar(f: ConstraintFields) -> Result<Option<RequestedGrammar>, ApiError> {
    let mut found: Vec<RequestedGrammar> = Vec::new();
    match f.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => found.push(RequestedGrammar {
            grammar: Grammar::json_object(),
            param: "response_format",
        }),
        Some(ResponseFormat::JsonSchema { json_schema }) => found.push(RequestedGrammar {
            grammar: match json_schema.schema {
                Some(schema) => Grammar::Json {
                    schema: schema_value(schema, "response_format.json_schema.schema")?,
                    strict: json_schema.strict.unwrap_or(false),
                },
                None => Grammar::json_object(),
            },
            param: "response_format",
        }),
    }
    if let Some(so) = f.structured_outputs {
        found.extend(structured_outputs(so)?);
    }
    if let Some(schema) = f.guided_json {
        found.push(RequestedGrammar {
            grammar: Grammar::Json {
                schema: schema_value(schema, "guided_json")?,
                strict: true,
            },
            param: "guided_json",
        });
    }
    if let Some(rx) = f.guided_regex {
        found.push(RequestedGrammar {
            grammar: Grammar::Regex(rx),
            param: "guided_regex",
        });
    }
    if let Some(choices) = f.guided_choice {
        found.push(RequestedGrammar {
            grammar: Grammar::Choice(choices),
            param: "guided_choice",
        });
    }
    if let Some(text) = f.guided_grammar {
        found.push(RequestedGrammar {
            grammar: grammar_text(text, "guided_grammar")?,
            param: "guided_grammar",
        });
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            found[1].param,
            format!(
                "{} and {} both constrain the output; give only one.",
                found[0].param, found[1].param
            ),
        ));
    }
    Ok(found.pop())
}

fn structured_outputs(so: StructuredOutputs) -> Result<Vec<RequestedGrammar>, ApiError> {
    const PARAM: &str = "structured_outputs";
    if so.structural_tag.is_some() {
        return Err(ApiError::invalid(
            "structured_outputs.structural_tag",
            "structural tags are not supported; use json, regex, choice or grammar.",
        ));
    }
    for (name, given) in [
        ("backend", so.backend.is_some()),
        ("whitespace_pattern", so.whitespace_pattern.is_some()),
        (
            "disable_additional_properties",
            so.disable_additional_properties.is_some(),
        ),
        (
            "disable_any_whitespace",
            so.disable_any_whitespace.is_some(),
        ),
        ("disable_fallback", so.disable_fallback.is_some()),
    ] {
        if given {
            tracing::debug!(
                "structured_outputs.{name} is an option of vLLM's own backends; ignored"
            );
        }
    }
    let mut out = Vec::new();
    let mut push = |grammar| {
        out.push(RequestedGrammar {
            grammar,
            param: PARAM,
        })
    };
    if let Some(schema) = so.json {
        push(Grammar::Json {
            schema: schema_value(schema, "structured_outputs.json")?,
            strict: true,
        });
    }
    if let Some(rx) = so.regex {
        push(Grammar::Regex(rx));
    }
    if let Some(choices) = so.choice {
        push(Grammar::Choice(choices));
    }
    if let Some(text) = so.grammar {
        push(grammar_text(text, "structured_outputs.grammar")?);
    }
    if so.json_object == Some(true) {
        push(Grammar::json_object());
    }
    match out.len() {
        0 => Err(ApiError::invalid(
            PARAM,
            "structured_outputs names no constraint: give one of json, regex, choice, grammar \
             or json_object.",
        )),
        1 => Ok(out),
        _ => Err(ApiError::invalid(
            PARAM,
            "structured_outputs names several constraints; give only one.",
        )),
    }
}

/// A schema given as an object, or as a string holding one (vLLM takes both).
fn schema_value(schema: Value, param: &'static str) -> Result<Value, ApiError> {
    match schema {
        Value::String(text) => serde_json::from_str(&text)
            .map_err(|e| ApiError::invalid(param, format!("the schema is not valid JSON: {e}"))),
        other => Ok(other),
    }
}

/// A grammar in Lark, or in GBNF (a rule written `name ::= ...`), which is converted.
fn grammar_text(text: String, param: &'static str) -> Result<Grammar, ApiError> {
    Grammar::from_text(text)
        .map_err(|e| ApiError::invalid(param, format!("invalid GBNF grammar: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(r: Result<Option<RequestedGrammar>, ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    #[test]
    fn each_field_gives_its_grammar() {
        let g = requested_grammar(ConstraintFields {
            response_format: Some(ResponseFormat::JsonObject),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(g.grammar, Grammar::json_object());
        let g = requested_grammar(ConstraintFields {
            guided_json: Some(json!("{\"type\": \"string\"}")),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            g.grammar,
            Grammar::Json {
                schema: json!({"type": "string"}),
                strict: true
            }
        );
        assert_eq!(g.param, "guided_json");
        let g = requested_grammar(ConstraintFields {
            structured_outputs: Some(StructuredOutputs {
                choice: Some(vec!["a".into()]),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(g.grammar, Grammar::Choice(vec!["a".into()]));
        assert!(requested_grammar(ConstraintFields {
            response_format: Some(ResponseFormat::Text),
            ..Default::default()
        })
        .unwrap()
        .is_none());
    }

    #[test]
    fn gbnf_is_converted_and_lark_kept() {
        let g = requested_grammar(ConstraintFields {
            guided_grammar: Some("root ::= \"yes\" | \"no\"".into()),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert!(matches!(g.grammar, Grammar::Lark(ref l) if l.contains("start")));
        let lark = "start: \"a\"+";
        let g = requested_grammar(ConstraintFields {
            guided_grammar: Some(lark.into()),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(g.grammar, Grammar::Lark(lark.into()));
    }

    #[test]
    fn conflicting_or_empty_constraints_name_their_field() {
        assert_eq!(
            param(requested_grammar(ConstraintFields {
                response_format: Some(ResponseFormat::JsonObject),
                guided_regex: Some("a".into()),
                ..Default::default()
            })),
            Some("guided_regex".into())
        );
        assert_eq!(
            param(requested_grammar(ConstraintFields {
                structured_outputs: Some(StructuredOutputs::default()),
                ..Default::default()
            })),
            Some("structured_outputs".into())
        );
        assert_eq!(
            param(requested_grammar(ConstraintFields {
                guided_json: Some(json!("{not json")),
                ..Default::default()
            })),
            Some("guided_json".into())
        );
        assert_eq!(
            param(requested_grammar(ConstraintFields {
                guided_grammar: Some("root ::= undefined-rule".into()),
                ..Default::default()
            })),
            Some("guided_grammar".into())
        );
    }
}
