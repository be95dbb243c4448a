//! Every grammar the engine constrains output with, written in one place: what a request
//! states ([`Grammar`]: a JSON schema, a regex, a list of choices, Lark or GBNF text), the
//! tool-call grammars ([`tool_calls`]), and their text in llguidance's Lark dialect or JSON
//! schema form. The server picks which grammar a request's fields ask for;
//! [`crate::constraint`] compiles it against the model's vocabulary.

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::{json, Value};

pub mod gbnf;
mod tool_calls;

pub use gbnf::GbnfError;
pub use tool_calls::FunctionSpec;

/// Most alternatives a `choice` constraint may list, and the longest one in bytes: each
/// becomes a branch of the lexer.
pub const MAX_CHOICES: usize = 1024;
pub const MAX_CHOICE_BYTES: usize = 4096;
/// Longest grammar, regex or schema text accepted, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// A language the output must belong to, as a request states it.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid against `schema`. `strict` (OpenAI's flag): a schema keyword the
    /// grammar engine cannot enforce is an error; without it such a keyword is left
    /// unenforced (the rest of the schema still is).
    Json { schema: Value, strict: bool },
    /// Text matching a regular expression (Rust `regex` syntax), anchored at both ends.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// `inner`, after an opening written in Lark: Harmony's `<|channel|>final<|message|>`
    /// before a structured answer, whose control tokens no text grammar can spell
    /// ([`Grammar::harmony_answer`]).
    Opened {
        opening: String,
        inner: Box<Grammar>,
    },
}

impl Grammar {
    /// A grammar written as text: GBNF (llama.cpp's format, a rule written `name ::= ...`),
    /// converted, or else llguidance's Lark dialect as it is.
    pub fn from_text(text: String) -> Result<Self, GbnfError> {
        if gbnf::is_gbnf(&text) {
            Ok(Self::Lark(gbnf::gbnf_to_lark(&text)?))
        } else {
            Ok(Self::Lark(text))
        }
    }

    /// `self` as the answer of a Harmony model (gpt-oss): on the `final` channel, directly, as
    /// a forced format skips a thinking model's reasoning.
    pub fn harmony_answer(self) -> Self {
        Self::Opened {
            opening: "<|channel|> \"final\" <|message|>".into(),
            inner: Box::new(self),
        }
    }

    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn json_object() -> Self {
        Self::Json {
            schema: json!({"type": "object"}),
            strict: true,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Json { .. } => "json_schema",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Lark(_) => "grammar",
            Self::Opened { inner, .. } => inner.kind(),
        }
    }

    /// The grammar's identity as text: equal keys compile to the same constraint.
    pub(crate) fn cache_key(&self) -> String {
        match self {
            Self::Json { schema, strict } => format!("json\0{strict}\0{schema}"),
            Self::Regex(rx) => format!("regex\0{rx}"),
            Self::Choice(choices) => format!("choice\0{}", Value::from(choices.clone())),
            Self::Lark(text) => format!("lark\0{text}"),
            Self::Opened { opening, inner } => {
                format!("opened\0{opening}\0{}", inner.cache_key())
            }
        }
    }

    pub(crate) fn into_top_level(self) -> Result<TopLevelGrammar, GrammarError> {
        match self {
            Self::Json { mut schema, strict } => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Invalid(
                        "a JSON schema must be an object (or a boolean)".into(),
                    ));
                }
                if let Value::Object(fields) = &mut schema {
                    fields
                        .entry("x-guidance")
                        .or_insert_with(|| json_layout(strict));
                }
                check_size(&schema.to_string())?;
                Ok(TopLevelGrammar::from_json_schema(schema))
            }
            Self::Regex(rx) => {
                check_size(&rx)?;
                Ok(TopLevelGrammar::from_regex(&rx))
            }
            Self::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GrammarError::Invalid("the list of choices is empty".into()));
                }
                if choices.len() > MAX_CHOICES {
                    return Err(GrammarError::Invalid(format!(
                        "{} choices were given; at most {MAX_CHOICES} are allowed",
                        choices.len()
                    )));
                }
                let mut alternatives = Vec::with_capacity(choices.len());
                for c in &choices {
                    if c.len() > MAX_CHOICE_BYTES {
                        return Err(GrammarError::Invalid(format!(
                            "a choice has {} bytes; at most {MAX_CHOICE_BYTES} are allowed",
                            c.len()
                        )));
                    }
                    // A JSON string literal is a valid Lark string literal.
                    alternatives.push(Value::String(c.clone()).to_string());
                }
                Ok(TopLevelGrammar::from_lark(format!(
                    "start: {}",
                    alternatives.join(" | ")
                )))
            }
            Self::Lark(text) => {
                check_size(&text)?;
                Ok(TopLevelGrammar::from_lark(text))
            }
            Self::Opened { opening, inner } => {
                let mut grammars = inner.into_top_level()?.grammars;
                let Some(inner) = grammars.first_mut() else {
                    return Err(GrammarError::Invalid("the grammar is empty".into()));
                };
                inner.name = Some("answer".into());
                let outer = GrammarWithLexer::from_lark(format!("start: {opening} @answer"));
                grammars.insert(0, outer);
                Ok(TopLevelGrammar {
                    grammars,
                    max_tokens: None,
                })
            }
        }
    }
}

/// How JSON is spelled inside every grammar: one line, one space after `,` and `:`. Models
/// were trained on this spelling (Python's `json.dumps`), and flexible whitespace lets a small
/// model pad forever. `strict`: a schema keyword the grammar engine cannot enforce is an
/// error rather than left unenforced.
pub(crate) fn json_layout(strict: bool) -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": !strict,
    })
}

fn check_size(text: &str) -> Result<(), GrammarError> {
    if text.len() > MAX_GRAMMAR_BYTES {
        return Err(GrammarError::Invalid(format!(
            "the constraint has {} bytes; at most {MAX_GRAMMAR_BYTES} are allowed",
            text.len()
        )));
    }
    Ok(())
}

/// A grammar that cannot be written out for the grammar engine; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("{0}")]
    Invalid(String),
}
