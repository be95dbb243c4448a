//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`) turns a list
//! of messages into the prompt text it was trained on. Rendered with minijinja, configured to
//! behave like Hugging Face's `apply_chat_template` (trim_blocks, lstrip_blocks, Python string
//! methods, `raise_exception`).

use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value as TemplateValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, TokenizerError};
use crate::python_json::{to_python_json, to_python_json_default, PythonJsonStyle};
use crate::template_date::TemplateDate;
use crate::tool_parser::ToolCallFormat;

/// Name under which the template is stored in its environment. No file extension, so
/// minijinja applies no HTML auto-escaping.
const TEMPLATE_NAME: &str = "chat";

/// The ChatML format (`<|im_start|>role\ncontent<|im_end|>\n`), for models that ship no
/// template but were tuned on ChatML, as SmolLM2 and Qwen were.
const CHATML: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma's turns (`<start_of_turn>user\n...<end_of_turn>\n`, the assistant's role named
/// `model`), for Gemma files that ship no template (the GGUF conversions of base models): as
/// Gemma 3's own template, it has no system role (a system message's text opens the first user
/// turn, followed by a blank line), wants user and model turns to alternate, and trims each
/// message.
const GEMMA: &str = "{{ bos_token }}\
{%- if messages and messages[0]['role'] == 'system' -%}\
{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\
{%- set loop_messages = messages[1:] -%}\
{%- else -%}\
{%- set first_user_prefix = '' -%}\
{%- set loop_messages = messages -%}\
{%- endif -%}\
{%- for message in loop_messages -%}\
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{%- endif -%}\
{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' \
+ (first_user_prefix if loop.first else '') + (message['content'] | trim) + '<end_of_turn>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";

/// One message of a conversation, as the template sees it (`message['role']`,
/// `message['content']`, and for tool use `message.tool_calls`, `message.tool_call_id`,
/// `message.name`). The optional fields are left out of the template's view when empty, so
/// `{% if message.tool_calls %}` and `message.tool_call_id is defined` behave as they do with
/// the dicts Hugging Face templates are written for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// Calls an assistant message made (OpenAI `tool_calls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatToolCall>,
    /// On a `tool` message: the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the function that produced it (some templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// On an assistant message: what the model reasoned before it (Qwen3's templates read
    /// `reasoning_content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same reasoning under the name gpt-oss's template reads (`thinking`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// One call in an assistant message's history, as templates read it:
/// `tool_call.function.name`, `tool_call.function.arguments | tojson`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatToolCall {
    pub id: String,
    /// Always `"function"` (the only kind of tool OpenAI defines).
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: ChatFunctionCall,
}

impl ChatToolCall {
    /// A function call with the given id, name and arguments object.
    pub fn function(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: id.into(),
            kind: function_kind(),
            function: ChatFunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

fn function_kind() -> String {
    "function".to_string()
}

/// The function a call names and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatFunctionCall {
    pub name: String,
    /// The arguments as a JSON object value, not the JSON string OpenAI clients send: templates
    /// print it with `tojson` (as vLLM and Hugging Face do, the caller parses the client's
    /// string first).
    pub arguments: Value,
}

/// What a render needs besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// End the prompt with the opening of an assistant turn, so the continuation is the reply.
    pub add_generation_prompt: bool,
    /// The request's OpenAI `tools` array as given (`[{"type": "function", "function": {...}}]`),
    /// seen by the template as `tools`. `None` and an empty array both render as no tools.
    pub tools: Option<&'a [Value]>,
    /// The request's `chat_template_kwargs` (`enable_thinking`, ...): extra template variables.
    /// They cannot replace `messages`, `tools`, `add_generation_prompt`, `bos_token` or
    /// `eos_token`.
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
}

/// A compiled chat template. Compile once per model; rendering is cheap and `&self`.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// The template reads `tools`; otherwise [`ChatTemplate::render_with`] describes the tools
    /// in a system message itself.
    renders_tools: bool,
    /// The template reads `tool_calls` (or handles `tool` messages); otherwise tool history is
    /// rewritten into plain Hermes-style text before rendering.
    renders_tool_history: bool,
    /// What `strftime_now` formats.
    date: TemplateDate,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("renders_tools", &self.renders_tools)
            .field("date", &self.date)
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
        // Hugging Face's global for templates that print today's date (gpt-oss's system
        // message: "Current date: ..."); [`ChatTemplate::with_date`] pins it.
        add_strftime_now(&mut env, TemplateDate::Today);
        // minijinja's own `tojson` writes compact, HTML-escaped JSON; templates expect the text
        // of Python's json.dumps, which is what the model saw in training.
        env.add_filter("tojson", python_tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| {
                TokenizerError::Template(format!("cannot compile the chat template: {e:#}"))
            })?;
        let variables = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(e.to_string()))?
            .undeclared_variables(true);
        let renders_tools = variables.contains("tools");
        // A template may print tool history without a `tools` variable (tools described by
        // the user), and reads the calls as `message.tool_calls` or `message['tool_calls']`.
        let renders_tool_history = renders_tools || source.contains("tool_calls");
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
            renders_tools,
            renders_tool_history,
            date: TemplateDate::Today,
        })
    }

    /// The template with `strftime_now` formatting `date` instead of the clock's: a pinned
    /// day renders the same prompt every day.
    pub fn with_date(mut self, date: TemplateDate) -> Self {
        add_strftime_now(&mut self.env, date);
        self.date = date;
        self
    }

    /// What `strftime_now` formats in this template.
    pub fn date(&self) -> TemplateDate {
        self.date
    }

    /// Whether the template prints a date (calls `strftime_now`), so that the rendered prompt
    /// depends on [`ChatTemplate::date`].
    pub fn reads_date(&self) -> bool {
        self.source.contains("strftime_now")
    }

    /// The ChatML template, the fallback for a model without `tokenizer.chat_template` whose
    /// vocabulary has `<|im_start|>`/`<|im_end|>`. It adds no default system prompt.
    pub fn chatml() -> Result<Self> {
        Self::new(CHATML, None, None)
    }

    /// Gemma's template, the fallback for a model without `tokenizer.chat_template` whose
    /// vocabulary has `<start_of_turn>`/`<end_of_turn>`; it opens with `bos_token`.
    pub fn gemma(bos_token: Option<&str>) -> Result<Self> {
        Self::new(GEMMA, bos_token, None)
    }

    /// The template's Jinja source, as given to [`ChatTemplate::new`].
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template itself reads the `tools` variable. When it does not,
    /// [`render_with`](Self::render_with) describes the tools in a system message in the
    /// Hermes format.
    pub fn renders_tools(&self) -> bool {
        self.renders_tools
    }

    /// The format in which the model writes tool calls: the one the template's text shows
    /// ([`ToolCallFormat::detect`]), else Hermes, which is what
    /// [`render_with`](Self::render_with) teaches a template that does not render tools, and
    /// what most current open models (Qwen 2.5/3, Hermes) use.
    pub fn tool_call_format(&self) -> ToolCallFormat {
        ToolCallFormat::detect(&self.source).unwrap_or(ToolCallFormat::Hermes)
    }

    /// Whether the template mentions the variable `name` (a switch such as `enable_thinking`
    /// that a request's fields may set through the render's keyword arguments).
    pub fn reads(&self, name: &str) -> bool {
        self.source.contains(name)
    }

    /// Whether the model reasons inside `<think>...</think>` (the template mentions `<think>`).
    pub fn thinks(&self) -> bool {
        self.source.contains("<think>")
    }

    /// Whether a rendered prompt ends inside an open `<think>` block (Qwen3-style templates end
    /// the generation prompt with `<think>\n`), so the model's first words are reasoning
    /// without an opening tag of their own.
    pub fn prompt_opens_thinking(rendered_prompt: &str) -> bool {
        rendered_prompt.trim_end().ends_with("<think>")
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends with the opening
    /// of an assistant turn, so the model's continuation is the reply. A template's
    /// `raise_exception("...")` (e.g. "roles must alternate") fails here with that message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                ..RenderOptions::default()
            },
        )
    }

    /// [`render`](Self::render) with tools and extra template variables. For a template that
    /// does not render tools itself, non-empty `tools` are described in a system message
    /// (appended to the first system message, or a new leading one) with the instruction to
    /// answer in `<tool_call>` blocks; and for a template that prints no tool history
    /// (plain ChatML prints only `content`), assistant calls and `tool` results are written
    /// into the messages' text in that same format.
    pub fn render_with(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let tools = options.tools.filter(|tools| !tools.is_empty());
        let mut messages = std::borrow::Cow::Borrowed(messages);
        if let (false, Some(tools)) = (self.renders_tools, tools) {
            messages = std::borrow::Cow::Owned(with_tools_system_text(&messages, tools));
        }
        if !self.renders_tool_history {
            messages = std::borrow::Cow::Owned(hermes_history(&messages));
        }
        let extra = TemplateValue::from_serialize(options.kwargs);
        template
            .render(context! {
                messages => messages.as_ref(),
                tools => tools,
                add_generation_prompt => options.add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                ..extra
            })
            .map_err(|e| {
                TokenizerError::Template(format!("cannot render the chat template: {e:#}"))
            })
    }
}

/// Registers `strftime_now(format)`: `date`'s moment formatted by `format` as Python's
/// `datetime.strftime` (what Hugging Face's `strftime_now` gives a template); an unknown
/// directive is a template error.
fn add_strftime_now(env: &mut Environment<'static>, date: TemplateDate) {
    env.add_function(
        "strftime_now",
        move |format: &str| -> std::result::Result<String, minijinja::Error> {
            use std::fmt::Write;
            let mut out = String::new();
            write!(out, "{}", date.moment().format(format)).map_err(|_| {
                minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!("strftime_now: cannot format the date with {format:?}"),
                )
            })?;
            Ok(out)
        },
    );
}

/// The system text that teaches a model without a tool-aware template to call `tools` in the
/// Hermes format, which [`ToolCallFormat::Hermes`] parses back.
fn hermes_tools_prompt(tools: &[Value]) -> String {
    let mut text = String::from(
        "# Tools\n\n\
         You can call functions to help with the user's request. Their signatures are listed \
         below, one JSON object per line, between <tools> and </tools>:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&to_python_json_default(tool));
    }
    text.push_str(
        "\n</tools>\n\n\
         To call a function, answer with a JSON object holding its name and its arguments \
         between <tool_call> and </tool_call>, one block per call:\n\
         <tool_call>\n{\"name\": \"<function name>\", \"arguments\": {<arguments as a JSON object>}}\n</tool_call>",
    );
    text
}

/// `messages` with `tools` described at the end of the first system message, or in a new
/// leading one.
fn with_tools_system_text(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let tools_text = hermes_tools_prompt(tools);
    let mut out = messages.to_vec();
    match out.first_mut() {
        Some(first) if first.role == "system" => {
            if !first.content.is_empty() {
                first.content.push_str("\n\n");
            }
            first.content.push_str(&tools_text);
        }
        _ => out.insert(0, ChatMessage::new("system", tools_text)),
    }
    out
}

/// `messages` with tool use written into their text, for a template that only prints `role`
/// and `content`: each assistant call appended to its message as a `<tool_call>` block, and
/// each run of `tool` results turned into one user message of `<tool_response>` blocks.
fn hermes_history(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut previous_was_tool = false;
    for message in messages {
        if message.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", message.content);
            match out.last_mut() {
                // Consecutive results answer one turn of calls: one user turn holds them all.
                Some(last) if previous_was_tool => {
                    last.content.push('\n');
                    last.content.push_str(&block);
                }
                _ => out.push(ChatMessage::new("user", block)),
            }
            previous_was_tool = true;
            continue;
        }
        previous_was_tool = false;
        let mut content = message.content.clone();
        for call in &message.tool_calls {
            if !content.is_empty() {
                content.push('\n');
            }
            let call_object = serde_json::json!({
                "name": call.function.name,
                "arguments": call.function.arguments,
            });
            content.push_str("<tool_call>\n");
            content.push_str(&to_python_json_default(&call_object));
            content.push_str("\n</tool_call>");
        }
        out.push(ChatMessage {
            role: message.role.clone(),
            content,
            ..ChatMessage::default()
        });
    }
    out
}

/// Hugging Face's `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, keyword arguments included.
fn python_tojson(value: &TemplateValue, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let json = serde_json::to_value(value).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e)
    })?;
    let indent: Option<TemplateValue> = kwargs.get("indent")?;
    let mut style = match indent.filter(|v| !v.is_none() && !v.is_undefined()) {
        None => PythonJsonStyle::default(),
        Some(indent) => match indent.as_str() {
            Some(text) => PythonJsonStyle::with_indent(text.to_string()),
            None => {
                let width = usize::try_from(indent)?;
                PythonJsonStyle::with_indent(" ".repeat(width))
            }
        },
    };
    if let Some(ensure_ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        style.ensure_ascii = ensure_ascii;
    }
    if let Some(sort_keys) = kwargs.get::<Option<bool>>("sort_keys")? {
        style.sort_keys = sort_keys;
    }
    if let Some(separators) = kwargs.get::<Option<Vec<String>>>("separators")? {
        let [item, key]: [String; 2] = separators.try_into().map_err(|_| {
            Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            )
        })?;
        style.item_separator = item;
        style.key_separator = key;
    }
    kwargs.assert_all_used()?;
    Ok(to_python_json(&json, &style))
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

    /// A pinned date is what `strftime_now` formats, in any directive, the time at midnight;
    /// a template without `strftime_now` does not read it.
    #[test]
    fn a_pinned_date_is_what_strftime_now_prints() {
        let source = "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}|\
                      {{ strftime_now('%A %H:%M:%S') }}";
        let pinned = ChatTemplate::new(source, None, None)
            .unwrap()
            .with_date("2026-11-28".parse().unwrap());
        assert!(pinned.reads_date());
        assert_eq!(
            pinned.render(&[], false).unwrap(),
            "2026-11-28|28 Nov 2026|Saturday 00:00:00"
        );
        // Pinning again replaces the day; `today` hands the date back to the clock.
        let later = pinned.with_date("2027-12-01".parse().unwrap());
        assert!(later.render(&[], false).unwrap().starts_with("2027-12-01|"));
        let today = later.with_date(TemplateDate::Today);
        let clock = || chrono::Local::now().format("%Y-%m-%d").to_string();
        let (before, text, after) = (clock(), today.render(&[], false).unwrap(), clock());
        assert!(
            text.starts_with(&before) || text.starts_with(&after),
            "{text}"
        );
        assert!(!ChatTemplate::chatml().unwrap().reads_date());
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

    /// As Gemma 3's own template renders (the text of llama.cpp's fixture for this
    /// conversation): the system text opens the first user turn; the assistant is `model`.
    #[test]
    fn gemma_folds_the_system_message_into_the_first_user_turn() {
        let t = ChatTemplate::gemma(Some("<bos>")).unwrap();
        let m = msgs(&[
            (
                "system",
                "You are a helpful assistant. Answer in one short sentence.",
            ),
            ("user", "What is the capital of Japan?"),
        ]);
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<bos><start_of_turn>user\nYou are a helpful assistant. Answer in one short \
             sentence.\n\nWhat is the capital of Japan?<end_of_turn>\n<start_of_turn>model\n"
        );
        let m = msgs(&[
            ("user", "Hi! What is 2 + 2?"),
            ("assistant", " 2 + 2 = 4. "),
            ("user", "And what is that times 3?"),
        ]);
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<bos><start_of_turn>user\nHi! What is 2 + 2?<end_of_turn>\n<start_of_turn>model\n\
             2 + 2 = 4.<end_of_turn>\n<start_of_turn>user\nAnd what is that times 3?\
             <end_of_turn>\n<start_of_turn>model\n"
        );
        // Turns that do not alternate are the template's error, as Gemma's own raises it.
        let err = t
            .render(&msgs(&[("user", "a"), ("user", "b")]), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("alternate"), "{err}");
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

    fn weather_tool() -> Value {
        serde_json::from_str(
            r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'later'", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}"#,
        )
        .unwrap()
    }

    fn weather_call() -> ChatToolCall {
        ChatToolCall::function(
            "call_1",
            "get_weather",
            serde_json::from_str(r#"{"city": "Zürich", "unit": "c", "days": 1.0}"#).unwrap(),
        )
    }

    #[test]
    fn tojson_writes_python_json_dumps_text_in_insertion_order() {
        let t = ChatTemplate::new("{{ tools[0] | tojson }}", None, None).unwrap();
        let tools = [weather_tool()];
        let options = RenderOptions {
            tools: Some(&tools),
            ..RenderOptions::default()
        };
        // What Hugging Face's tojson (json.dumps, ensure_ascii=False) prints for this dict.
        assert_eq!(
            t.render_with(&[], &options).unwrap(),
            r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'later'", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}"#
        );
        let t = ChatTemplate::new(
            "{{ x | tojson(indent=2) }}|{{ x | tojson(ensure_ascii=True, sort_keys=True) }}|{{ x | tojson(separators=(',', ':')) }}",
            None,
            None,
        )
        .unwrap();
        let kwargs: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"x": {"b": "é", "a": [1]}}"#).unwrap();
        let options = RenderOptions {
            kwargs: Some(&kwargs),
            ..RenderOptions::default()
        };
        assert_eq!(
            t.render_with(&[], &options).unwrap(),
            "{\n  \"b\": \"é\",\n  \"a\": [\n    1\n  ]\n}|{\"a\": [1], \"b\": \"\\u00e9\"}|{\"b\":\"é\",\"a\":[1]}"
        );
    }

    #[test]
    fn templates_see_tool_calls_and_tool_results() {
        let source = "{% for m in messages %}{{ m.role }}:{{ m.content }}\
{% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.type }} {{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}{% endif %}\
{% if m.tool_call_id is defined %}({{ m.tool_call_id }} {{ m.name }}){% endif %}|{% endfor %}";
        let t = ChatTemplate::new(source, None, None).unwrap();
        let mut assistant = ChatMessage::new("assistant", "");
        assistant.tool_calls.push(weather_call());
        let mut result = ChatMessage::new("tool", "sunny");
        result.tool_call_id = Some("call_1".into());
        result.name = Some("get_weather".into());
        let messages = [ChatMessage::new("user", "hi"), assistant, result];
        assert_eq!(
            t.render(&messages, false).unwrap(),
            r#"user:hi|assistant:[function call_1 get_weather {"city": "Zürich", "unit": "c", "days": 1.0}]|tool:sunny(call_1 get_weather)|"#
        );
    }

    #[test]
    fn openai_tool_history_deserializes() {
        let json = r#"[{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c", "days": 1.0}}}]},
                       {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]"#;
        let messages: Vec<ChatMessage> = serde_json::from_str(json).unwrap();
        assert_eq!(messages[0].tool_calls, vec![weather_call()]);
        assert_eq!(messages[1].tool_call_id.as_deref(), Some("call_1"));
        // Empty optional fields stay out of what templates see.
        let plain = serde_json::to_value(ChatMessage::new("user", "x")).unwrap();
        assert_eq!(plain, serde_json::json!({"role": "user", "content": "x"}));
    }

    #[test]
    fn kwargs_are_variables_but_cannot_replace_the_reserved_ones() {
        let t = ChatTemplate::new(
            "{{ enable_thinking }} {{ messages | length }} {{ add_generation_prompt }} {{ bos_token }} {{ tools }}",
            Some("<s>"),
            None,
        )
        .unwrap();
        let kwargs: serde_json::Map<String, Value> = serde_json::from_str(
            r#"{"enable_thinking": false, "messages": [], "add_generation_prompt": "no", "bos_token": "X", "tools": "T"}"#,
        )
        .unwrap();
        let options = RenderOptions {
            add_generation_prompt: true,
            tools: None,
            kwargs: Some(&kwargs),
        };
        assert_eq!(
            t.render_with(&msgs(&[("user", "a")]), &options).unwrap(),
            "False 1 True <s> None"
        );
    }

    #[test]
    fn tool_aware_templates_get_tools_untouched() {
        let t = ChatTemplate::new(
            "{% if tools %}{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
            None,
            None,
        )
        .unwrap();
        assert!(t.renders_tools());
        let tools = [weather_tool()];
        let options = RenderOptions {
            tools: Some(&tools),
            ..RenderOptions::default()
        };
        assert_eq!(
            t.render_with(&msgs(&[("user", "q")]), &options).unwrap(),
            "get_weather;q"
        );
        // An empty tools array is no tools.
        let options = RenderOptions {
            tools: Some(&[]),
            ..RenderOptions::default()
        };
        assert_eq!(
            t.render_with(&msgs(&[("user", "q")]), &options).unwrap(),
            "q"
        );
    }

    #[test]
    fn chatml_learns_tools_and_tool_history_as_hermes_text() {
        let t = ChatTemplate::chatml().unwrap();
        assert!(!t.renders_tools());
        assert_eq!(t.tool_call_format(), ToolCallFormat::Hermes);
        let tools = [weather_tool()];
        let options = RenderOptions {
            add_generation_prompt: true,
            tools: Some(&tools),
            kwargs: None,
        };
        let mut assistant = ChatMessage::new("assistant", "Checking.");
        assistant.tool_calls.push(weather_call());
        let mut second = weather_call();
        second.function.arguments = serde_json::json!({"city": "Bern"});
        assistant.tool_calls.push(second);
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Weather?"),
            assistant,
            ChatMessage::new("tool", "sunny"),
            ChatMessage::new("tool", "rain"),
        ];
        let prompt = t.render_with(&messages, &options).unwrap();
        let tools_text = hermes_tools_prompt(&tools);
        assert!(tools_text.contains(&format!(
            "<tools>\n{}\n</tools>",
            to_python_json_default(&tools[0])
        )));
        assert_eq!(
            prompt,
            format!(
                "<|im_start|>system\nBe brief.\n\n{tools_text}<|im_end|>\n\
                 <|im_start|>user\nWeather?<|im_end|>\n\
                 <|im_start|>assistant\nChecking.\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Zürich\", \"unit\": \"c\", \"days\": 1.0}}}}\n</tool_call>\n\
                 <tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Bern\"}}}}\n</tool_call><|im_end|>\n\
                 <|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n\
                 <|im_start|>assistant\n"
            )
        );
        // Without a system message the tools get one of their own; without tools, none.
        let prompt = t.render_with(&msgs(&[("user", "q")]), &options).unwrap();
        assert!(prompt.starts_with(&format!(
            "<|im_start|>system\n{tools_text}<|im_end|>\n<|im_start|>user\nq"
        )));
        let plain = t
            .render_with(&msgs(&[("user", "q")]), &RenderOptions::default())
            .unwrap();
        assert_eq!(plain, "<|im_start|>user\nq<|im_end|>\n");
    }

    #[test]
    fn thinking_templates_and_prompts_are_recognized() {
        let t = ChatTemplate::new("{{ '<think>\\n' }}", None, None).unwrap();
        assert!(t.thinks());
        assert!(!ChatTemplate::chatml().unwrap().thinks());
        assert!(ChatTemplate::prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!ChatTemplate::prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!ChatTemplate::prompt_opens_thinking(
            "<|im_start|>assistant\n"
        ));
    }
}
