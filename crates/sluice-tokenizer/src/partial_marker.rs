//! Holding back streamed text that may be the beginning of a marker (`<tool_call>`,
//! `</think>`), so that no part of a marker is given out before it is known to be one.

/// Where text can be given out up to, in `text` holding no complete `marker`: before a trailing
/// piece that could begin `marker`, and before the whitespace in front of that (the parsers
/// drop whitespace that only separates a marker from the text).
pub(crate) fn hold_point(text: &str, marker: &str) -> usize {
    let longest = marker.len().saturating_sub(1).min(text.len());
    // Markers are ASCII, so a matching suffix starts on a character boundary.
    let held_from = (1..=longest)
        .rev()
        .find(|length| text.ends_with(&marker[..*length]))
        .map_or(text.len(), |length| text.len() - length);
    text[..held_from].trim_end().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_a_partial_marker_and_the_whitespace_before_it() {
        assert_eq!(hold_point("hello <tool_", "<tool_call>"), 5);
        assert_eq!(hold_point("hello <", "<tool_call>"), 5);
        assert_eq!(hold_point("a < b", "<tool_call>"), 5);
        assert_eq!(hold_point("a\n\n", "<tool_call>"), 1);
        assert_eq!(hold_point("é", "<tool_call>"), 2);
        assert_eq!(hold_point("", "</think>"), 0);
    }
}
