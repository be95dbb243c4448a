//! Checks on generated code with the machine's python3.

use std::io::Write;
use std::process::{Command, Stdio};

/// Whether `code` (cut to its last whole line) has a prefix of lines that Python parses and
/// that returns something: the model wrote a function, not prose. `None` without python3.
pub fn python_parses(code: &str) -> Option<bool> {
    let script = r#"
import ast, sys
lines = sys.stdin.read().split("\n")[:-1]
for n in range(len(lines), 0, -1):
    src = "\n".join(lines[:n])
    try:
        ast.parse(src)
    except SyntaxError:
        continue
    sys.exit(0 if "return" in src and n > 1 else 2)
sys.exit(1)
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(code.as_bytes())
        .unwrap();
    Some(child.wait().unwrap().success())
}

/// Asserts that `text`, `def fibonacci(n):` and a greedy continuation, is a coherent Python
/// body: it returns, recurses or uses `n`, and (where python3 is) a prefix of it parses.
pub fn assert_fibonacci_body(text: &str) {
    assert!(text.contains("return"), "{text}");
    assert!(
        text.matches("fibonacci(").count() >= 2 || text.contains(" n"),
        "the body does not use fibonacci or n: {text}"
    );
    match python_parses(text) {
        Some(ok) => assert!(ok, "not a Python function body:\n{text}"),
        None => eprintln!("python3 not found: the syntax check was skipped"),
    }
}
