//! What `sluice chat` keeps between turns and how it reads a line: the conversation (system
//! prompt, messages, the model asked), the slash commands, and lines continued with a
//! trailing backslash. Pure logic, no terminal and no network.

use serde_json::{json, Value};

/// A line the user typed, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A message to send.
    Message(String),
    /// `/system TEXT` sets the system prompt; `/system` alone clears it.
    System(Option<String>),
    /// `/clear`: forget the conversation (the system prompt stays).
    Clear,
    /// `/model NAME` asks another served model; `/model` alone lists them.
    Model(Option<String>),
    /// `/help`.
    Help,
    /// `/exit` or `/quit`.
    Exit,
    /// Nothing to do (an empty line).
    Nothing,
    /// A slash command that does not exist.
    Unknown(String),
}

pub const HELP: &str = "\
/system TEXT  set the system prompt (/system alone clears it)
/clear        start the conversation again
/model NAME   talk to another served model (/model alone lists them)
/exit         leave (also ctrl-d)
A line ending with \\ continues on the next; ctrl-c stops an answer.";

/// Reads one (joined) input.
pub fn parse(text: &str) -> Input {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Input::Nothing;
    }
    let Some(command) = trimmed.strip_prefix('/') else {
        return Input::Message(text.trim_end().to_string());
    };
    let (name, rest) = match command.split_once(char::is_whitespace) {
        Some((name, rest)) => (name, rest.trim()),
        None => (command, ""),
    };
    let rest = (!rest.is_empty()).then(|| rest.to_string());
    match name {
        "system" => Input::System(rest),
        "clear" => Input::Clear,
        "model" => Input::Model(rest),
        "help" | "?" => Input::Help,
        "exit" | "quit" => Input::Exit,
        _ => Input::Unknown(name.to_string()),
    }
}

/// Lines joined until one does not end with a backslash: `Some(line)` is a continuation to
/// ask for the next line of.
#[derive(Debug, Default)]
pub struct Lines {
    pending: String,
}

impl Lines {
    /// Adds a typed line; `Some(text)` when the input is whole, `None` when it continues.
    pub fn push(&mut self, line: &str) -> Option<String> {
        match line.strip_suffix('\\') {
            Some(head) => {
                self.pending.push_str(head);
                self.pending.push('\n');
                None
            }
            None => {
                self.pending.push_str(line);
                Some(std::mem::take(&mut self.pending))
            }
        }
    }

    /// Whether a continued input is waiting for its next line.
    pub fn continuing(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Drops a half-typed input (ctrl-c at the prompt).
    pub fn reset(&mut self) {
        self.pending.clear();
    }
}

/// The conversation sent with each turn.
#[derive(Debug, Default)]
pub struct Conversation {
    pub system: Option<String>,
    messages: Vec<(&'static str, String)>,
}

impl Conversation {
    pub fn new(system: Option<String>) -> Self {
        Self {
            system,
            messages: Vec::new(),
        }
    }

    pub fn push_user(&mut self, text: String) {
        self.messages.push(("user", text));
    }

    /// The answer as shown, a stopped one too (what the user saw is what the model said).
    pub fn push_assistant(&mut self, text: String) {
        self.messages.push(("assistant", text));
    }

    /// Takes back the last user message (its answer failed before anything was shown).
    pub fn pop_user(&mut self) {
        if matches!(self.messages.last(), Some(("user", _))) {
            self.messages.pop();
        }
    }

    pub fn clear(&mut self) {
        self.messages.clear();
    }

    /// The `messages` array of a chat completion request.
    pub fn messages(&self) -> Value {
        let system = self
            .system
            .iter()
            .map(|s| json!({"role": "system", "content": s}));
        let turns = self
            .messages
            .iter()
            .map(|(role, content)| json!({"role": role, "content": content}));
        Value::Array(system.chain(turns).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_messages_are_told_apart() {
        assert_eq!(parse("  "), Input::Nothing);
        assert_eq!(parse("hello there "), Input::Message("hello there".into()));
        assert_eq!(
            parse("/system be  brief "),
            Input::System(Some("be  brief".into()))
        );
        assert_eq!(parse("/system"), Input::System(None));
        assert_eq!(parse("/clear"), Input::Clear);
        assert_eq!(parse("/model coder"), Input::Model(Some("coder".into())));
        assert_eq!(parse("/model"), Input::Model(None));
        assert_eq!(parse("/exit"), Input::Exit);
        assert_eq!(parse("/quit"), Input::Exit);
        assert_eq!(parse("/help"), Input::Help);
        assert_eq!(parse("/nope x"), Input::Unknown("nope".into()));
        // Blanks around a command do not hide it.
        assert_eq!(parse(" /clear "), Input::Clear);
    }

    #[test]
    fn a_trailing_backslash_continues_the_input() {
        let mut lines = Lines::default();
        assert_eq!(lines.push("first\\"), None);
        assert!(lines.continuing());
        assert_eq!(lines.push("second\\"), None);
        assert_eq!(lines.push("third"), Some("first\nsecond\nthird".into()));
        assert!(!lines.continuing());
        assert_eq!(lines.push("alone"), Some("alone".into()));
        assert_eq!(lines.push("half\\"), None);
        lines.reset();
        assert_eq!(lines.push("fresh"), Some("fresh".into()));
    }

    #[test]
    fn the_request_carries_the_system_prompt_then_the_turns() {
        let mut c = Conversation::default();
        c.push_user("hi".into());
        c.push_assistant("hello".into());
        c.push_user("again".into());
        assert_eq!(c.messages().as_array().unwrap().len(), 3);
        c.system = Some("be brief".into());
        let m = c.messages();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[3], json!({"role": "user", "content": "again"}));
        let turns = |c: &Conversation| c.messages().as_array().unwrap().len() - 1;
        c.pop_user();
        assert_eq!(turns(&c), 2);
        c.pop_user();
        assert_eq!(turns(&c), 2, "only a trailing user message is taken back");
        c.clear();
        assert_eq!(turns(&c), 0);
        assert_eq!(Conversation::new(None).messages(), json!([]));
    }
}
