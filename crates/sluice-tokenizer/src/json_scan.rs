//! JSON read a character at a time, for the parsers that must decide on text as it streams:
//! a string literal, and the nesting of an object or array.

/// A JSON string literal read a character at a time, quotes included.
#[derive(Debug, Clone, Default)]
pub(crate) struct StringLiteral {
    text: String,
    escaped: bool,
}

impl StringLiteral {
    /// Reads the next character (the opening quote first); true when it closed the string.
    pub(crate) fn feed(&mut self, c: char) -> bool {
        let opening = self.text.is_empty();
        self.text.push(c);
        if opening {
            return false;
        }
        if self.escaped {
            self.escaped = false;
            return false;
        }
        match c {
            '\\' => {
                self.escaped = true;
                false
            }
            '"' => true,
            _ => false,
        }
    }

    /// The string's value, escapes resolved; `None` for an invalid escape.
    pub(crate) fn decode(&self) -> Option<String> {
        serde_json::from_str(&self.text).ok()
    }
}

/// Follows a JSON object or array a character at a time: its depth, and whether it is inside a
/// string, where braces and quotes behind a backslash do not count.
#[derive(Debug, Clone, Default)]
pub(crate) struct NestingScanner {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl NestingScanner {
    /// Reads the next character (the opening bracket first); true when it closed the value.
    pub(crate) fn feed(&mut self, c: char) -> bool {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
            }
            return false;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ => {}
        }
        false
    }
}
