//! The request fields that constrain what a model may write: OpenAI's `response_format`,
//! vLLM's `structured_outputs` object and its older `guided_*` fields, and function `tools`
//! with `tool_choice`. Plain data; [`crate::chat::grammar`] turns them into a grammar.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// OpenAI's `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    /// Absent: any JSON object.
    pub schema: Option<Value>,
    /// OpenAI's flag; see [`sluice_engine::Grammar::Json`].
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: exactly one of the constraint fields.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StructuredOutputs {
    /// A JSON schema, as an object or as a string holding one.
    pub json: Option<Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    /// Lark (llguidance's dialect) or GBNF (llama.cpp's), told apart by `::=`.
    pub grammar: Option<String>,
    /// Any JSON object.
    pub json_object: Option<bool>,
    /// Options for vLLM's own backends; sluice's is llguidance, so they have no meaning here
    /// (named in a debug log line when given).
    pub backend: Option<String>,
    pub whitespace_pattern: Option<String>,
    pub disable_additional_properties: Option<bool>,
    pub disable_any_whitespace: Option<bool>,
    pub disable_fallback: Option<bool>,
    /// vLLM's structural tags are not served: refused by name.
    pub structural_tag: Option<Value>,
}

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema for the arguments object; absent means any object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "function":
/// {"name": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Function(String),
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        const SHAPE: &str =
            "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", \
                             \"function\": {\"name\": ...}}";
        match Value::deserialize(d)? {
            Value::String(s) => match s.as_str() {
                "none" => Ok(Self::None),
                "auto" => Ok(Self::Auto),
                "required" => Ok(Self::Required),
                _ => Err(D::Error::custom(SHAPE)),
            },
            Value::Object(o) => {
                if o.get("type").and_then(Value::as_str) != Some("function") {
                    return Err(D::Error::custom(SHAPE));
                }
                match o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                {
                    Some(name) => Ok(Self::Function(name.to_string())),
                    None => Err(D::Error::custom(SHAPE)),
                }
            }
            _ => Err(D::Error::custom(SHAPE)),
        }
    }
}

/// A tool call in an assistant message of the history, as OpenAI clients send it back.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallIn {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// OpenAI sends a string holding JSON; some clients send the object itself.
    pub arguments: Value,
}

/// A tool call the model made, in a response message.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionCallOut {
    pub name: String,
    /// The arguments object as JSON text, as OpenAI sends it.
    pub arguments: String,
}

/// A fragment of a tool call in a stream chunk: the first one of a call has its id, type and
/// name, later ones add to `function.arguments`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// Fields of a request body that no typed field took.
pub type ExtraFields = Map<String, Value>;

/// The constraint fields of a request, as both generation endpoints take them.
#[derive(Debug, Clone, Default)]
pub struct ConstraintFields {
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
}
