//! `sluice chat`: a conversation in the terminal, against a running server (`--url`) or a
//! model served in-process (`--model` and every `sluice serve` flag: the server itself, bound
//! to a loopback port, so the chat template, reasoning and tools are exactly the server's).
//!
//! Line editing and history are rustyline's; a line ending with `\` continues the input.
//! Ctrl-C during an answer stops it (the request is dropped, so the server frees the
//! sequence) and returns to the prompt; at the prompt it clears the line; ctrl-d or `/exit`
//! leaves.

mod client;
mod session;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use rustyline::error::ReadlineError;

use crate::commands::shutdown::Signals;
use crate::config::{Config, ServeArgs};
use client::{Client, Delta, Sampling};
use session::{Conversation, Input, Lines, HELP};

#[derive(clap::Args)]
pub struct ChatArgs {
    /// A running server to talk to (`http://HOST:PORT`); without it the model (`--model` or
    /// the configuration's) is served in-process on a loopback port.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// The model to ask [default: the server's first].
    #[arg(long = "model-name", value_name = "NAME")]
    model_name: Option<String>,
    /// The system prompt to start with (`/system` changes it).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Sampling temperature [default: the server's, 1.0 unless the model says otherwise].
    #[arg(long)]
    temperature: Option<f32>,
    /// Most tokens an answer may have [default: what the context leaves].
    #[arg(long, value_name = "N")]
    max_tokens: Option<u32>,
    /// The history file [default: $HOME/.local/state/sluice/chat_history].
    #[arg(long, value_name = "PATH")]
    history: Option<PathBuf>,
    /// `sluice serve`'s flags, for the in-process server; `--api-key` is also the key sent to
    /// a `--url` server.
    #[command(flatten)]
    serve: Box<ServeArgs>,
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-chat")
        .build()
        .context("cannot start the async runtime")?;
    let api_key = args.serve.api_key.as_ref().map(|k| k.0.clone());
    let url = match &args.url {
        Some(url) => {
            if args.serve.model.is_some() {
                anyhow::bail!("--url talks to a running server, --model serves one here: give one");
            }
            url.clone()
        }
        None => runtime.block_on(serve_in_process(&args.serve))?,
    };
    let client = Client::new(&url, api_key);
    let models = runtime
        .block_on(client.models())
        .with_context(|| format!("the server at {url}"))?;
    let mut model = match &args.model_name {
        Some(name) => name.clone(),
        None => models
            .first()
            .cloned()
            .context("the server lists no model")?,
    };
    let mut chat = Chat {
        client,
        conversation: Conversation::new(args.system.clone()),
        sampling: Sampling {
            temperature: args.temperature,
            max_tokens: args.max_tokens,
        },
        style: Style::for_stdout(),
    };

    let mut editor = rustyline::DefaultEditor::new().context("cannot set up line editing")?;
    let history = args.history.clone().or_else(default_history);
    if let Some(path) = &history {
        // A first run has no file yet.
        let _ = editor.load_history(path);
    }
    eprintln!("{model} at {url}; /help for commands, ctrl-d to leave");
    let mut lines = Lines::default();
    loop {
        let prompt = if lines.continuing() { "... " } else { "> " };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                lines.reset();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("reading the terminal"),
        };
        let Some(text) = lines.push(&line) else {
            continue;
        };
        if !text.trim().is_empty() {
            let _ = editor.add_history_entry(text.as_str());
        }
        match session::parse(&text) {
            Input::Nothing => {}
            Input::Exit => break,
            Input::Help => println!("{HELP}"),
            Input::Clear => {
                chat.conversation.clear();
                println!("(conversation cleared)");
            }
            Input::System(system) => {
                println!(
                    "{}",
                    match &system {
                        Some(_) => "(system prompt set)",
                        None => "(system prompt cleared)",
                    }
                );
                chat.conversation.system = system;
            }
            Input::Model(None) => println!("{}", models.join("\n")),
            Input::Model(Some(name)) => {
                let served = runtime.block_on(chat.client.models()).unwrap_or_default();
                if served.contains(&name) {
                    model = name;
                    println!("(now asking {model})");
                } else {
                    println!("no model {name}; served: {}", served.join(", "));
                }
            }
            Input::Unknown(name) => println!("no command /{name}; /help lists them"),
            Input::Message(text) => runtime.block_on(chat.turn(&model, text)),
        }
    }
    if let Some(path) = &history {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = editor.save_history(path);
    }
    Ok(())
}

/// Starts `sluice serve`'s server in this process on a loopback port and returns its URL once
/// the model has loaded. It has no signal handlers (ctrl-c belongs to the chat) and ends with
/// the process.
async fn serve_in_process(args: &ServeArgs) -> anyhow::Result<String> {
    let mut args = args.clone();
    args.host = Some("127.0.0.1".into());
    args.port = Some(0);
    let config = Config::resolve(&args)?;
    eprintln!("loading {} ...", config.model.first().display());
    let (ready, address) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(crate::commands::serve::serve(
        config,
        Signals::none(),
        Some(ready),
    ));
    match address.await {
        Ok(address) => Ok(format!("http://{address}")),
        // The server ended before it was ready: its error says why.
        Err(_) => match server.await {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => anyhow::bail!("the in-process server stopped before it was ready"),
            Err(e) => anyhow::bail!("the in-process server panicked: {e}"),
        },
    }
}

fn default_history() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".local/state/sluice/chat_history"))
}

struct Chat {
    client: Client,
    conversation: Conversation,
    sampling: Sampling,
    style: Style,
}

impl Chat {
    /// Sends `text` and prints the answer as it streams, until it ends or ctrl-c stops it.
    async fn turn(&mut self, model: &str, text: String) {
        self.conversation.push_user(text);
        let mut printer = Printer::new(self.style);
        let start = Instant::now();
        let answer = self.client.stream_chat(
            model,
            self.conversation.messages(),
            self.sampling,
            |delta| printer.show(delta),
        );
        let outcome = tokio::select! {
            result = answer => result.map(|()| false),
            _ = tokio::signal::ctrl_c() => Ok(true),
        };
        printer.end_line();
        let stopped = match outcome {
            Ok(stopped) => stopped,
            Err(e) => {
                eprintln!("error: {e}");
                if printer.content.is_empty() {
                    self.conversation.pop_user();
                    return;
                }
                true
            }
        };
        println!("{}", self.style.dim(&printer.stats(start, stopped)));
        self.conversation
            .push_assistant(std::mem::take(&mut printer.content));
    }
}

/// Escapes for a terminal; none when stdout is a pipe or a file.
#[derive(Clone, Copy)]
struct Style {
    terminal: bool,
}

impl Style {
    fn for_stdout() -> Self {
        Self {
            terminal: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn dim(&self, text: &str) -> String {
        if self.terminal {
            format!("\x1b[2m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// Prints an answer's pieces as they come: reasoning dimmed, tool calls on lines of their
/// own, the content plain; and keeps the content and the counts for the statistics line.
struct Printer {
    style: Style,
    content: String,
    pieces: u64,
    tokens: Option<u64>,
    first: Option<Instant>,
    finish: Option<String>,
    /// What the last piece printed was, to break lines between kinds.
    last: Option<Kind>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    Tool,
}

impl Printer {
    fn new(style: Style) -> Self {
        Self {
            style,
            content: String::new(),
            pieces: 0,
            tokens: None,
            first: None,
            finish: None,
            last: None,
        }
    }

    fn show(&mut self, delta: Delta) {
        let (kind, text) = match delta {
            Delta::Reasoning(text) => (Kind::Reasoning, self.style.dim(&text)),
            Delta::Content(text) => {
                self.content.push_str(&text);
                (Kind::Content, text)
            }
            Delta::ToolCall { name, arguments } => {
                let head = name
                    .map(|n| format!("[tool call {n}] "))
                    .unwrap_or_default();
                (Kind::Tool, self.style.dim(&format!("{head}{arguments}")))
            }
            Delta::Finish(reason) => {
                self.finish = Some(reason);
                return;
            }
            Delta::Usage { completion_tokens } => {
                self.tokens = Some(completion_tokens);
                return;
            }
        };
        self.first.get_or_insert_with(Instant::now);
        self.pieces += 1;
        let mut out = std::io::stdout().lock();
        if self.last.is_some_and(|last| last != kind) {
            let _ = writeln!(out);
        }
        self.last = Some(kind);
        let _ = write!(out, "{text}");
        let _ = out.flush();
    }

    fn end_line(&mut self) {
        if self.last.is_some() {
            println!();
        }
    }

    /// `[12 tokens, 30.1 tok/s, first token 85 ms, stop]`.
    fn stats(&self, start: Instant, stopped: bool) -> String {
        let tokens = self.tokens.unwrap_or(self.pieces);
        let mut parts = vec![format!("{tokens} tokens")];
        if let Some(first) = self.first {
            let decode = first.elapsed().as_secs_f64();
            if tokens > 1 && decode > 0.0 {
                parts.push(format!("{:.1} tok/s", (tokens - 1) as f64 / decode));
            }
            parts.push(format!(
                "first token {:.0} ms",
                (first - start).as_secs_f64() * 1e3
            ));
        }
        match (stopped, &self.finish) {
            (true, _) => parts.push("stopped".into()),
            (false, Some(reason)) => parts.push(reason.clone()),
            (false, None) => {}
        }
        format!("[{}]", parts.join(", "))
    }
}
