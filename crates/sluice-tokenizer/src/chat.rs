//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`) turns a list
//! of messages into the prompt text it was trained on. Rendered with minijinja, configured to
//! behave like Hugging Face's `apply_chat_template` (trim_blocks, lstrip_blocks, Python string
//! methods, `raise_exception`).

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TokenizerError};

/// Name under which the template is stored in its environment. No file extension, so
/// minijinja applies no HTML auto-escaping.
const TEMPLATE_NAME: &str = "chat";

/// The ChatML format (`<|im_start|>role\ncontent<|im_end|>\n`), for models that ship no
/// template but were tuned on ChatML, as SmolLM2 and Qwen were.
const CHATML: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// One message of a conversation, as the template sees it (`message['role']`,
/// `message['content']`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template. Compile once per model; rendering is cheap and `&self`.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the texts templates see as `bos_token`
    /// and `eos_token` (empty when the model has none). A syntax error is reported here, not
    /// at the first request.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        // Hugging Face renders with these two on; templates are written for them.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // `.strip()`, `.startswith()`, `.items()`, ... as the Python templates call them.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| {
                TokenizerError::Template(format!("cannot compile the chat template: {e:#}"))
            })?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        })
    }

    /// The ChatML template, the fallback for a model without `tokenizer.chat_template` whose
    /// vocabulary has `<|im_start|>`/`<|im_end|>`. It adds no default system prompt.
    pub fn chatml() -> Result<Self> {
        Self::new(CHATML, None, None)
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends with the opening
    /// of an assistant turn, so the model's continuation is the reply. A template's
    /// `raise_exception("...")` (e.g. "roles must alternate") fails here with that message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| {
                TokenizerError::Template(format!("cannot render the chat template: {e:#}"))
            })
    }
}

/// Hugging Face's template helper: templates call it to reject a conversation they cannot
/// format.
fn raise_exception(message: String) -> std::result::Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    #[test]
    fn chatml_renders_turns_and_generation_prompt() {
        let t = ChatTemplate::chatml().unwrap();
        let m = msgs(&[("system", "Be brief."), ("user", "Hi")]);
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!t.render(&m, false).unwrap().ends_with("assistant\n"));
    }

    #[test]
    fn python_string_methods_and_block_trimming_work() {
        let source = "{% for m in messages %}\n  {% if m.content.startswith('x') %}\n{{ m.role.upper() }}:{{ m.content.strip() }}|\n  {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(source, None, None).unwrap();
        let m = msgs(&[("user", "x  spaced  "), ("assistant", "no")]);
        assert_eq!(t.render(&m, false).unwrap(), "USER:x  spaced|\n");
    }

    #[test]
    fn bos_and_eos_are_visible_to_templates() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}",
            Some("<s>"),
            Some("</s>"),
        )
        .unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "q")]), false).unwrap(),
            "<s>q</s>"
        );
        let t = ChatTemplate::new("{{ bos_token }}x", None, None).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "x");
    }

    #[test]
    fn raise_exception_fails_rendering_with_its_message() {
        let source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(source, None, None).unwrap();
        assert_eq!(t.render(&msgs(&[("user", "a")]), false).unwrap(), "ok");
        let err = t
            .render(&msgs(&[("assistant", "a")]), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Conversation must start with user"), "{err}");
    }

    #[test]
    fn syntax_errors_are_reported_at_compile_time() {
        let err = ChatTemplate::new("{% for m in messages %}", None, None).unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)));
    }

    #[test]
    fn messages_deserialize_from_openai_json() {
        let m: Vec<ChatMessage> =
            serde_json::from_str(r#"[{"role":"user","content":"hi"}]"#).unwrap();
        assert_eq!(m, msgs(&[("user", "hi")]));
    }
}
