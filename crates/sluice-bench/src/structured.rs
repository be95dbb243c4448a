//! Structured workloads: a JSON schema or a set of tools sent with every request, and the check
//! that each output honours it (a structured benchmark that measured garbage would be useless).
//!
//! The check is a small JSON Schema validator covering what structured-output schemas use:
//! `type`, `enum`, `const`, `properties`, `required`, `additionalProperties`, `items`,
//! `prefixItems`, `minItems`/`maxItems`, `uniqueItems`, `minLength`/`maxLength`, `pattern`,
//! `minimum`/`maximum` (and the exclusive ones), `anyOf`/`oneOf`/`allOf` and local `$ref`s.
//! Other keywords (`format`, ...) are not checked.

use std::path::Path;

use anyhow::{bail, ensure, Context};
use serde_json::{json, Map, Value};

/// Where a JSON schema goes in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaField {
    /// OpenAI's `response_format: {"type": "json_schema", "json_schema": {...}}` (sluice takes
    /// it on both endpoints; vLLM on chat, and on completions in recent versions).
    ResponseFormat,
    /// vLLM's `structured_outputs: {"json": schema}` (vLLM >= 0.10.2, sluice).
    StructuredOutputs,
    /// vLLM's older `guided_json: schema` (sluice too).
    GuidedJson,
}

/// What constrains each request's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Structure {
    /// Nothing: free text.
    Plain,
    JsonSchema {
        name: String,
        schema: Value,
        field: SchemaField,
    },
    /// OpenAI function tools and the `tool_choice` sent with them.
    Tools { tools: Vec<Value>, choice: Value },
}

/// One streamed tool call, reassembled from its deltas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

impl Structure {
    /// Reads a JSON schema from `path`: a bare schema, or OpenAI's `json_schema` object
    /// (`{"name": ..., "schema": {...}, "strict": ...}`).
    pub fn json_schema_file(path: &Path, field: SchemaField) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("schema");
        Self::json_schema(value, stem, field)
    }

    pub fn json_schema(
        value: Value,
        default_name: &str,
        field: SchemaField,
    ) -> anyhow::Result<Self> {
        ensure!(value.is_object(), "a JSON schema must be an object");
        let (name, schema) = match value.get("schema") {
            Some(schema) if schema.is_object() && value.get("type").is_none() => (
                value["name"].as_str().unwrap_or(default_name).to_string(),
                schema.clone(),
            ),
            _ => (default_name.to_string(), value),
        };
        // OpenAI's names: letters, digits, `_` and `-`, at most 64.
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        Ok(Self::JsonSchema {
            name,
            schema,
            field,
        })
    }

    /// Reads a JSON array of OpenAI tools from `path`; `choice` is `required`, `auto`, `none`
    /// or a function's name.
    pub fn tools_file(path: &Path, choice: &str) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        Self::tools(value, choice).with_context(|| format!("tools in {}", path.display()))
    }

    pub fn tools(value: Value, choice: &str) -> anyhow::Result<Self> {
        let Value::Array(list) = value else {
            bail!("expected a JSON array of tools");
        };
        ensure!(!list.is_empty(), "the tool list is empty");
        let mut tools = Vec::with_capacity(list.len());
        for (i, tool) in list.into_iter().enumerate() {
            // A bare function (`{"name", "parameters"}`) is wrapped as OpenAI wants it.
            let tool = if tool.get("type").is_none() && tool.get("name").is_some() {
                json!({"type": "function", "function": tool})
            } else {
                tool
            };
            ensure!(
                tool["type"] == "function",
                "tool {i}: only function tools (\"type\": \"function\") are benchmarked"
            );
            ensure!(
                tool["function"]["name"]
                    .as_str()
                    .is_some_and(|n| !n.is_empty()),
                "tool {i} has no function.name"
            );
            tools.push(tool);
        }
        let choice = match choice {
            "required" | "auto" | "none" => Value::from(choice),
            name => {
                ensure!(
                    tools.iter().any(|t| t["function"]["name"] == name),
                    "--tool-choice `{name}` names none of the tools"
                );
                json!({"type": "function", "function": {"name": name}})
            }
        };
        Ok(Self::Tools { tools, choice })
    }

    pub fn is_plain(&self) -> bool {
        matches!(self, Self::Plain)
    }

    /// A short name for tables: `plain`, `json-schema`, `tools`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::JsonSchema { .. } => "json-schema",
            Self::Tools { .. } => "tools",
        }
    }

    /// Adds this structure's fields to a request body.
    pub fn apply(&self, body: &mut Map<String, Value>) {
        match self {
            Self::Plain => {}
            Self::JsonSchema {
                name,
                schema,
                field,
            } => {
                let (key, value) = match field {
                    SchemaField::ResponseFormat => (
                        "response_format",
                        json!({"type": "json_schema",
                               "json_schema": {"name": name, "schema": schema, "strict": true}}),
                    ),
                    SchemaField::StructuredOutputs => {
                        ("structured_outputs", json!({"json": schema}))
                    }
                    SchemaField::GuidedJson => ("guided_json", schema.clone()),
                };
                body.insert(key.into(), value);
            }
            Self::Tools { tools, choice } => {
                body.insert("tools".into(), Value::Array(tools.clone()));
                body.insert("tool_choice".into(), choice.clone());
            }
        }
    }

    /// Whether an output honours the structure: `None` when there is nothing to check (free
    /// text, `tool_choice: "none"`). A schema's output must parse and validate; a tool
    /// workload's must hold at least one call, each naming one of the tools with arguments
    /// that validate against its parameters.
    pub fn check(&self, text: &str, calls: &[ToolCall]) -> Option<Result<(), String>> {
        match self {
            Self::Plain => None,
            Self::JsonSchema { schema, .. } => Some(
                serde_json::from_str::<Value>(text.trim())
                    .map_err(|e| format!("not JSON ({e})"))
                    .and_then(|v| validate(schema, &v)),
            ),
            Self::Tools { choice, .. } if *choice == "none" => None,
            Self::Tools { tools, .. } => Some(check_calls(tools, calls)),
        }
    }
}

fn check_calls(tools: &[Value], calls: &[ToolCall]) -> Result<(), String> {
    if calls.is_empty() {
        return Err("no tool call".into());
    }
    for call in calls {
        let Some(tool) = tools.iter().find(|t| t["function"]["name"] == *call.name) else {
            return Err(format!("a call to `{}`, which is no tool", call.name));
        };
        let args: Value = serde_json::from_str(&call.arguments)
            .map_err(|e| format!("`{}`: arguments are not JSON ({e})", call.name))?;
        let params = tool["function"]
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        validate(&params, &args).map_err(|e| format!("`{}`: {e}", call.name))?;
    }
    Ok(())
}

/// Checks `value` against `schema` (the subset of JSON Schema named in the module docs).
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    Validator { root: schema }.check(schema, value, "$")
}

struct Validator<'a> {
    root: &'a Value,
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => true,
    }
}

impl Validator<'_> {
    fn resolve(&self, reference: &str) -> Result<&Value, String> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| format!("$ref `{reference}` is not local"))?;
        self.root
            .pointer(pointer)
            .ok_or_else(|| format!("$ref `{reference}` points nowhere"))
    }

    fn check(&self, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
        let s = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(format!("{at}: no value is allowed here")),
            Value::Object(s) => s,
            _ => return Ok(()),
        };
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            self.check(self.resolve(r)?, v, at)?;
        }
        match s.get("type") {
            Some(Value::String(t)) if !type_matches(t, v) => {
                return Err(format!("{at}: expected {t}, got {v}"));
            }
            Some(Value::Array(ts))
                if !ts
                    .iter()
                    .any(|t| t.as_str().is_none_or(|t| type_matches(t, v))) =>
            {
                return Err(format!(
                    "{at}: expected one of {}, got {v}",
                    Value::Array(ts.clone())
                ));
            }
            _ => {}
        }
        if let Some(Value::Array(options)) = s.get("enum") {
            if !options.contains(v) {
                return Err(format!("{at}: {v} is not in the enum"));
            }
        }
        if let Some(c) = s.get("const") {
            if c != v {
                return Err(format!("{at}: {v} is not the constant {c}"));
            }
        }
        if let Some(Value::Array(subs)) = s.get("allOf") {
            for sub in subs {
                self.check(sub, v, at)?;
            }
        }
        if let Some(Value::Array(subs)) = s.get("anyOf") {
            if !subs.iter().any(|sub| self.check(sub, v, at).is_ok()) {
                return Err(format!("{at}: matches no anyOf branch"));
            }
        }
        if let Some(Value::Array(subs)) = s.get("oneOf") {
            let n = subs
                .iter()
                .filter(|sub| self.check(sub, v, at).is_ok())
                .count();
            if n != 1 {
                return Err(format!("{at}: matches {n} oneOf branches, not one"));
            }
        }
        match v {
            Value::Object(o) => self.check_object(s, o, at),
            Value::Array(a) => self.check_array(s, a, at),
            Value::String(text) => check_string(s, text, at),
            Value::Number(n) => check_number(s, n.as_f64().unwrap_or(f64::NAN), at),
            _ => Ok(()),
        }
    }

    fn check_object(
        &self,
        s: &Map<String, Value>,
        o: &Map<String, Value>,
        at: &str,
    ) -> Result<(), String> {
        if let Some(Value::Array(required)) = s.get("required") {
            for key in required.iter().filter_map(Value::as_str) {
                if !o.contains_key(key) {
                    return Err(format!("{at}: `{key}` is missing"));
                }
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (key, value) in o {
            let here = format!("{at}.{key}");
            match props.and_then(|p| p.get(key)) {
                Some(sub) => self.check(sub, value, &here)?,
                None => {
                    if let Some(extra) = s.get("additionalProperties") {
                        self.check(extra, value, &here)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn check_array(&self, s: &Map<String, Value>, a: &[Value], at: &str) -> Result<(), String> {
        let count = |k: &str| s.get(k).and_then(Value::as_u64).map(|n| n as usize);
        if let Some(min) = count("minItems") {
            if a.len() < min {
                return Err(format!("{at}: {} items, fewer than {min}", a.len()));
            }
        }
        if let Some(max) = count("maxItems") {
            if a.len() > max {
                return Err(format!("{at}: {} items, more than {max}", a.len()));
            }
        }
        let prefix = match s.get("prefixItems") {
            Some(Value::Array(p)) => p.as_slice(),
            _ => &[],
        };
        for (i, item) in a.iter().enumerate() {
            let here = format!("{at}[{i}]");
            match prefix.get(i) {
                Some(sub) => self.check(sub, item, &here)?,
                None => {
                    if let Some(sub) = s.get("items") {
                        self.check(sub, item, &here)?;
                    }
                }
            }
        }
        if s.get("uniqueItems") == Some(&Value::Bool(true)) {
            for (i, x) in a.iter().enumerate() {
                if a[..i].contains(x) {
                    return Err(format!("{at}: {x} appears twice"));
                }
            }
        }
        Ok(())
    }
}

fn check_string(s: &Map<String, Value>, text: &str, at: &str) -> Result<(), String> {
    let chars = text.chars().count();
    if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
        if (chars as u64) < min {
            return Err(format!("{at}: {chars} characters, fewer than {min}"));
        }
    }
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
        if chars as u64 > max {
            return Err(format!("{at}: {chars} characters, more than {max}"));
        }
    }
    if let Some(pattern) = s.get("pattern").and_then(Value::as_str) {
        let re = regex::Regex::new(pattern)
            .map_err(|e| format!("{at}: pattern `{pattern}` does not compile here ({e})"))?;
        if !re.is_match(text) {
            return Err(format!("{at}: {text:?} does not match `{pattern}`"));
        }
    }
    Ok(())
}

fn check_number(s: &Map<String, Value>, x: f64, at: &str) -> Result<(), String> {
    let bound = |k: &str| s.get(k).and_then(Value::as_f64);
    let fails = [
        ("minimum", bound("minimum").is_some_and(|b| x < b)),
        ("maximum", bound("maximum").is_some_and(|b| x > b)),
        (
            "exclusiveMinimum",
            bound("exclusiveMinimum").is_some_and(|b| x <= b),
        ),
        (
            "exclusiveMaximum",
            bound("exclusiveMaximum").is_some_and(|b| x >= b),
        ),
    ];
    match fails.iter().find(|(_, failed)| *failed) {
        Some((k, _)) => Err(format!("{at}: {x} breaks {k} {}", s[*k])),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../benchmarks/structured")
            .join(name)
    }

    #[test]
    fn schema_file_goes_in_the_chosen_field() {
        let s = Structure::json_schema_file(&example("schema.json"), SchemaField::ResponseFormat)
            .unwrap();
        let mut body = Map::new();
        s.apply(&mut body);
        let rf = &body["response_format"];
        assert_eq!(rf["type"], "json_schema");
        assert_eq!(rf["json_schema"]["name"], "schema");
        assert_eq!(rf["json_schema"]["strict"], true);
        assert_eq!(rf["json_schema"]["schema"]["type"], "object");

        let schema = json!({"type": "object"});
        for (field, key, want) in [
            (
                SchemaField::StructuredOutputs,
                "structured_outputs",
                json!({"json": schema}),
            ),
            (SchemaField::GuidedJson, "guided_json", schema.clone()),
        ] {
            let mut body = Map::new();
            Structure::json_schema(schema.clone(), "x", field)
                .unwrap()
                .apply(&mut body);
            assert_eq!(body.len(), 1);
            assert_eq!(body[key], want);
        }
    }

    #[test]
    fn openai_wrapper_gives_the_name() {
        let wrapped = json!({"name": "ticket v2", "strict": true, "schema": {"type": "object"}});
        let s = Structure::json_schema(wrapped, "file", SchemaField::ResponseFormat).unwrap();
        assert_eq!(
            s,
            Structure::JsonSchema {
                name: "ticket_v2".into(),
                schema: json!({"type": "object"}),
                field: SchemaField::ResponseFormat
            }
        );
        // A schema whose property is called `schema` stays a schema.
        let bare = json!({"type": "object", "schema": {"type": "string"}});
        let Structure::JsonSchema { schema, .. } =
            Structure::json_schema(bare.clone(), "f", SchemaField::GuidedJson).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(schema, bare);
        assert!(Structure::json_schema(json!([1]), "f", SchemaField::GuidedJson).is_err());
    }

    #[test]
    fn tools_file_and_choices() {
        let s = Structure::tools_file(&example("tools.json"), "required").unwrap();
        let Structure::Tools { tools, choice } = &s else {
            unreachable!()
        };
        assert_eq!(tools.len(), 3);
        assert_eq!(choice, "required");
        let mut body = Map::new();
        s.apply(&mut body);
        assert_eq!(body["tools"].as_array().unwrap().len(), 3);
        assert_eq!(body["tool_choice"], "required");

        let name = tools[0]["function"]["name"].as_str().unwrap();
        let Structure::Tools { choice, .. } =
            Structure::tools_file(&example("tools.json"), name).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(
            choice,
            json!({"type": "function", "function": {"name": name}})
        );
        assert!(Structure::tools_file(&example("tools.json"), "no_such_tool").is_err());

        // Bare functions are wrapped; objects and empty lists are refused.
        let bare = json!([{"name": "f", "parameters": {"type": "object"}}]);
        let Structure::Tools { tools, .. } = Structure::tools(bare, "auto").unwrap() else {
            unreachable!()
        };
        assert_eq!(tools[0]["type"], "function");
        assert_eq!(tools[0]["function"]["name"], "f");
        assert!(Structure::tools(json!({"name": "f"}), "auto").is_err());
        assert!(Structure::tools(json!([]), "auto").is_err());
        assert!(Structure::tools(json!([{"type": "web_search"}]), "auto").is_err());
    }

    #[test]
    fn example_files_are_valid_and_checkable() {
        let Structure::JsonSchema { schema, .. } =
            Structure::json_schema_file(&example("schema.json"), SchemaField::GuidedJson).unwrap()
        else {
            unreachable!()
        };
        let good = json!({
            "ticket_id": "TCK-20417",
            "category": "billing",
            "priority": "high",
            "customer": {"name": "Ada Lovelace", "tier": "pro", "account_age_months": 14},
            "tags": ["refund", "invoice"],
            "summary": "Charged twice for the March invoice.",
            "needs_escalation": true
        });
        validate(&schema, &good).unwrap();
        for (path, bad) in [
            ("/ticket_id", json!("tck-1")),
            ("/category", json!("weather")),
            ("/tags", json!([])),
            ("/tags", json!(["a", "b", "c", "d", "e"])),
            ("/customer/tier", json!("gold")),
            ("/customer/account_age_months", json!(-1)),
        ] {
            let mut v = good.clone();
            *v.pointer_mut(path).unwrap() = bad;
            assert!(validate(&schema, &v).is_err(), "{path} should fail: {v}");
        }
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove("summary");
        assert!(validate(&schema, &missing).is_err());
        let mut extra = good;
        extra["extra"] = json!(1);
        assert!(
            validate(&schema, &extra).is_err(),
            "additionalProperties is false"
        );

        // Every tool's parameters are an object schema with its required keys declared.
        let Structure::Tools { tools, .. } =
            Structure::tools_file(&example("tools.json"), "required").unwrap()
        else {
            unreachable!()
        };
        for t in &tools {
            let p = &t["function"]["parameters"];
            assert_eq!(p["type"], "object", "{t}");
            for r in p["required"].as_array().unwrap() {
                assert!(p["properties"].get(r.as_str().unwrap()).is_some(), "{t}");
            }
        }
    }

    #[test]
    fn outputs_are_checked() {
        let schema = Structure::json_schema(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            "s",
            SchemaField::ResponseFormat,
        )
        .unwrap();
        assert_eq!(schema.check(" {\"n\": 3} ", &[]), Some(Ok(())));
        assert!(
            schema.check("{\"n\": 3", &[]).unwrap().is_err(),
            "truncated"
        );
        assert!(schema.check("{\"n\": 3.5}", &[]).unwrap().is_err());
        assert_eq!(Structure::Plain.check("anything", &[]), None);

        let tools = Structure::tools(
            json!([{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false}}}]),
            "required",
        )
        .unwrap();
        let call = |name: &str, args: &str| ToolCall {
            name: name.into(),
            arguments: args.into(),
        };
        assert_eq!(
            tools.check("", &[call("f", r#"{"city": "Oslo"}"#)]),
            Some(Ok(()))
        );
        assert!(tools.check("prose", &[]).unwrap().is_err());
        assert!(tools.check("", &[call("g", "{}")]).unwrap().is_err());
        assert!(tools.check("", &[call("f", "{}")]).unwrap().is_err());
        assert!(tools
            .check("", &[call("f", r#"{"city": "Oslo"#)])
            .unwrap()
            .is_err());
        let Structure::Tools { tools: list, .. } = tools else {
            unreachable!()
        };
        let none = Structure::Tools {
            tools: list,
            choice: json!("none"),
        };
        assert_eq!(none.check("prose", &[]), None);
    }

    #[test]
    fn validator_keywords() {
        let root = json!({
            "$defs": {"pos": {"type": "integer", "minimum": 1}},
            "type": "object",
            "properties": {
                "a": {"$ref": "#/$defs/pos"},
                "b": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]},
                "c": {"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "number"},
                      "uniqueItems": true},
                "d": {"type": ["string", "null"], "pattern": "^[a-z]+$"},
                "e": {"oneOf": [{"type": "integer"}, {"type": "number"}]}
            },
            "additionalProperties": {"type": "boolean"}
        });
        validate(
            &root,
            &json!({"a": 2, "b": null, "c": ["x", 1, 2], "d": "ab", "z": true}),
        )
        .unwrap();
        validate(&root, &json!({"e": 1.5})).unwrap();
        for bad in [
            json!({"a": 0}),
            json!({"b": "abc"}),
            json!({"c": ["y"]}),
            json!({"c": ["x", 1, 1]}),
            json!({"d": "AB"}),
            json!({"d": 3}),
            json!({"e": 2}),
            json!({"z": 1}),
            json!([]),
        ] {
            assert!(validate(&root, &bad).is_err(), "{bad}");
        }
        assert!(validate(&json!(false), &json!(1)).is_err());
        validate(&json!(true), &json!(1)).unwrap();
        assert!(validate(&json!({"$ref": "#/nowhere"}), &json!(1)).is_err());
    }
}
