//! How a request's thinking fields reach the model: Anthropic's `thinking` and
//! `output_config.effort`, the Responses API's `reasoning.effort`. A model thinks as its chat
//! template says. A template with a switch gets it set from these fields: `enable_thinking`
//! (Qwen3's and its kind's: think or not) and `reasoning_effort` (gpt-oss's: `low`, `medium`,
//! `high`). A template without one (the model does not think, or cannot be told how much)
//! honours them by doing nothing, which `docs/api-fields.md` states.

use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_tokenizer::ChatTemplate;

/// How hard to think, in either API's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
    Max,
}

impl Effort {
    /// gpt-oss's three levels.
    fn template_level(self) -> &'static str {
        match self {
            Self::None | Self::Minimal | Self::Low => "low",
            Self::Medium => "medium",
            Self::High | Self::Xhigh | Self::Max => "high",
        }
    }
}

/// What a request says about thinking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThinkingRequest {
    /// Think or not (`None`: as the template does by default).
    pub enabled: Option<bool>,
    pub effort: Option<Effort>,
}

/// The chat template variables that carry `request`, for a template that reads them; `None`
/// when the template has no switch the request sets.
pub fn template_kwargs(
    template: Option<&ChatTemplate>,
    request: ThinkingRequest,
) -> Option<Map<String, Value>> {
    let template = template?;
    let mut kwargs = Map::new();
    // `effort: none` asks for no thinking where a template can only switch it off.
    let enabled = request
        .enabled
        .or_else(|| request.effort.map(|e| e != Effort::None));
    if let Some(enabled) = enabled.filter(|_| template.reads("enable_thinking")) {
        kwargs.insert("enable_thinking".into(), Value::Bool(enabled));
    }
    if let Some(effort) = request
        .effort
        .filter(|_| template.reads("reasoning_effort"))
    {
        kwargs.insert(
            "reasoning_effort".into(),
            Value::String(effort.template_level().into()),
        );
    }
    (!kwargs.is_empty()).then_some(kwargs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new(source, None, None).unwrap()
    }

    #[test]
    fn switches_are_set_only_where_the_template_has_them() {
        let qwen3 = template(
            "{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is defined \
             and not enable_thinking %}<think></think>{% endif %}",
        );
        let oss =
            template("{{ reasoning_effort }}{% for m in messages %}{{ m.content }}{% endfor %}");
        let plain = template("{% for m in messages %}{{ m.content }}{% endfor %}");
        let think = ThinkingRequest {
            enabled: Some(true),
            effort: Some(Effort::Max),
        };
        let kw = template_kwargs(Some(&qwen3), think).unwrap();
        assert_eq!(kw.get("enable_thinking"), Some(&Value::Bool(true)));
        assert!(!kw.contains_key("reasoning_effort"));
        let kw = template_kwargs(Some(&oss), think).unwrap();
        assert_eq!(
            kw.get("reasoning_effort"),
            Some(&Value::String("high".into()))
        );
        assert_eq!(template_kwargs(Some(&plain), think), None);
        // `effort: none` switches thinking off where that is all a template can do.
        let none = ThinkingRequest {
            enabled: None,
            effort: Some(Effort::None),
        };
        let kw = template_kwargs(Some(&qwen3), none).unwrap();
        assert_eq!(kw.get("enable_thinking"), Some(&Value::Bool(false)));
        assert_eq!(template_kwargs(None, think), None);
    }
}
