//! Request fields shared by the completion and chat endpoints, and the response parts they
//! share. Fields that accept several JSON shapes (`prompt`, `stop`, `seed`) are parsed by hand
//! so a wrong shape is a 400 that says what was expected.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// `prompt` of `/v1/completions`: a string, a list of strings, a list of token ids, or a list
/// of such lists.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

const PROMPT_SHAPE: &str =
    "expected a string, a list of strings, a list of token ids, or a list of lists of token ids";

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Self::Text(s)),
            Value::Array(items) => {
                match items.first() {
                    // An empty list is a list of nothing: the empty prompt, rejected later
                    // with the other empty-prompt cases.
                    None => Ok(Self::Texts(Vec::new())),
                    Some(Value::String(_)) => items
                        .into_iter()
                        .map(|v| match v {
                            Value::String(s) => Ok(s),
                            _ => Err(D::Error::custom(PROMPT_SHAPE)),
                        })
                        .collect::<Result<_, _>>()
                        .map(Self::Texts),
                    Some(Value::Number(_)) => token_ids(&items).map(Self::Tokens),
                    Some(Value::Array(_)) => items
                        .iter()
                        .map(|v| match v {
                            Value::Array(ids) => token_ids(ids),
                            _ => Err(D::Error::custom(PROMPT_SHAPE)),
                        })
                        .collect::<Result<_, _>>()
                        .map(Self::TokenLists),
                    Some(_) => Err(D::Error::custom(PROMPT_SHAPE)),
                }
            }
            _ => Err(D::Error::custom(PROMPT_SHAPE)),
        }
    }
}

fn token_ids<E: serde::de::Error>(items: &[Value]) -> Result<Vec<u32>, E> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    E::custom(format!(
                        "token ids must be integers from 0 to {}, got {v}",
                        u32::MAX
                    ))
                })
        })
        .collect()
}

/// `stop`: one string, a list of strings, or null.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopList(pub Vec<String>);

impl<'de> Deserialize<'de> for StopList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(Self::default()),
            Value::String(s) => Ok(Self(vec![s])),
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(D::Error::custom("expected a string or a list of strings")),
                })
                .collect::<Result<_, _>>()
                .map(Self),
            _ => Err(D::Error::custom("expected a string or a list of strings")),
        }
    }
}

/// `seed`: any integer OpenAI accepts (int64) or a u64; negative seeds keep their bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub u64);

impl<'de> Deserialize<'de> for Seed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = serde_json::Number::deserialize(d)?;
        if let Some(u) = n.as_u64() {
            Ok(Self(u))
        } else if let Some(i) = n.as_i64() {
            Ok(Self(i as u64))
        } else {
            Err(D::Error::custom(format!("expected an integer, got {n}")))
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Only for a model that reasons: how many completion tokens were its thinking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens_details: None,
        }
    }

    /// The usage of a reasoning model's response, which reports its thinking tokens.
    pub fn with_reasoning_tokens(mut self, reasoning_tokens: usize) -> Self {
        self.completion_tokens_details = Some(CompletionTokensDetails { reasoning_tokens });
        self
    }
}

/// Log-probabilities of the unmodified logits can be `-inf`, which JSON cannot carry; like
/// vLLM, report those as -9999.
pub fn finite_logprob(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_of_every_shape_parse() {
        let p = |s: &str| serde_json::from_str::<Prompt>(s);
        assert_eq!(p(r#""hi""#).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(
            p(r#"["a","b"]"#).unwrap(),
            Prompt::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(p("[1,2]").unwrap(), Prompt::Tokens(vec![1, 2]));
        assert_eq!(
            p("[[1],[2,3]]").unwrap(),
            Prompt::TokenLists(vec![vec![1], vec![2, 3]])
        );
        assert_eq!(p("[]").unwrap(), Prompt::Texts(vec![]));
        for bad in [
            "5",
            "null",
            "{}",
            r#"["a",1]"#,
            "[1,-1]",
            "[1.5]",
            "[4294967296]",
            "[[1],2]",
            "[true]",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stop_and_seed_accept_their_shapes() {
        let s = |t: &str| serde_json::from_str::<StopList>(t);
        assert_eq!(s(r#""x""#).unwrap().0, ["x"]);
        assert_eq!(s(r#"["x","y"]"#).unwrap().0, ["x", "y"]);
        assert!(s("null").unwrap().0.is_empty());
        assert!(s("[1]").is_err() && s("{}").is_err());
        let seed = |t: &str| serde_json::from_str::<Seed>(t);
        assert_eq!(seed("7").unwrap(), Seed(7));
        assert_eq!(seed("-1").unwrap(), Seed(u64::MAX));
        assert_eq!(seed("18446744073709551615").unwrap(), Seed(u64::MAX));
        assert!(seed("1.5").is_err() && seed("\"1\"").is_err());
    }
}
