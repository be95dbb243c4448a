//! JSON text as Python's `json.dumps` writes it. Hugging Face chat templates were written and
//! trained against `apply_chat_template`, whose `tojson` filter is
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`: `", "`
//! and `": "` between items, keys in insertion order, no HTML escaping, floats as Python's
//! `repr`. A prompt that spells a tool schema or call arguments differently from what the model
//! saw in training is a prompt the model was not trained on, so we reproduce that text exactly.

use serde_json::Value;

/// How to lay the text out; the defaults are those of Hugging Face's `tojson`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PythonJsonStyle {
    /// Escape every non-ASCII character as `\uXXXX` (Python's `ensure_ascii`).
    pub ensure_ascii: bool,
    /// Put each item on its own line, indented by this text per level (`indent=N` is N spaces).
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for PythonJsonStyle {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".to_string(),
            key_separator: ": ".to_string(),
            sort_keys: false,
        }
    }
}

impl PythonJsonStyle {
    /// Python switches the default item separator to `","` when an indent is given, since the
    /// newline already separates items.
    pub fn with_indent(indent: String) -> Self {
        Self {
            indent: Some(indent),
            item_separator: ",".to_string(),
            ..Self::default()
        }
    }
}

/// `value` as `json.dumps(value, ...)` with `style` would print it.
pub(crate) fn to_python_json(value: &Value, style: &PythonJsonStyle) -> String {
    let mut out = String::new();
    write_value(value, style, 0, &mut out);
    out
}

/// Hugging Face's default `tojson` text of `value`.
pub(crate) fn to_python_json_default(value: &Value) -> String {
    to_python_json(value, &PythonJsonStyle::default())
}

fn write_value(value: &Value, style: &PythonJsonStyle, level: usize, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => match (number.as_i64(), number.as_u64(), number.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (None, Some(u), _) => out.push_str(&u.to_string()),
            (None, None, Some(f)) => out.push_str(&python_float_repr(f)),
            (None, None, None) => out.push_str(&number.to_string()),
        },
        Value::String(text) => write_string(text, style.ensure_ascii, out),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_and_indent(style, level + 1, out);
                write_value(item, style, level + 1, out);
            }
            newline_and_indent(style, level, out);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_and_indent(style, level + 1, out);
                write_string(key, style.ensure_ascii, out);
                out.push_str(&style.key_separator);
                write_value(item, style, level + 1, out);
            }
            newline_and_indent(style, level, out);
            out.push('}');
        }
    }
}

fn newline_and_indent(style: &PythonJsonStyle, level: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

/// A string literal with Python's escapes: the two-character ones for `"`, `\`, `\n`, `\r`,
/// `\t`, `\b`, `\f`, `\u00xx` (lowercase hex) for other control characters, and with
/// `ensure_ascii` every character outside printable ASCII as `\uxxxx` (surrogate pairs above
/// the BMP).
fn write_string(text: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that read back to the same number, positional
/// when the decimal exponent is in -4..16 (always with a fractional part, `1.0`), scientific
/// otherwise with a signed two-digit-minimum exponent (`1e+16`, `1.5e-05`). `json.dumps` also
/// writes non-finite floats as `NaN`/`Infinity`, which JSON values from serde never hold.
fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0.0"
        } else {
            "0.0"
        }
        .to_string();
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "1.5e-7", "-1e20".
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (whole, fraction) = digits.split_at(point as usize);
            format!("{whole}.{fraction}")
        };
        format!("{sign}{text}")
    } else {
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exponent_sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_style_matches_python_json_dumps() {
        // Expected texts are what CPython 3 prints for json.dumps(x, ensure_ascii=False).
        let value: Value = serde_json::from_str(
            r#"{"z": 1, "a": [true, null, 2.5, "é<>&'\"\\\n\u0001"], "m": {}, "e": []}"#,
        )
        .unwrap();
        assert_eq!(
            to_python_json_default(&value),
            r#"{"z": 1, "a": [true, null, 2.5, "é<>&'\"\\\n\u0001"], "m": {}, "e": []}"#
        );
    }

    #[test]
    fn indent_ensure_ascii_and_sorting_follow_python() {
        let value = json!({"b": [1, {"c": "ü😀"}], "a": {}});
        let style = PythonJsonStyle {
            ensure_ascii: true,
            sort_keys: true,
            ..PythonJsonStyle::with_indent("  ".to_string())
        };
        assert_eq!(
            to_python_json(&value, &style),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    {\n      \"c\": \"\\u00fc\\ud83d\\ude00\"\n    }\n  ]\n}"
        );
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (value, python) in [
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (123.456, "123.456"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(python_float_repr(value), python, "{value}");
        }
    }
}
