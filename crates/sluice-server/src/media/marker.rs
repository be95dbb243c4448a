//! Where each image is in the prompt: a message's parts joined into the one text its chat
//! template sees, a marker standing for each image, and the rendered prompt split back at the
//! markers for tokenization, text pieces and images in order.
//!
//! This is what llama.cpp's server does, so one template renders one prompt in both:
//! - `tools/server/server-common.cpp` (`oaicompat_content_load_media`, called by
//!   `oaicompat_chat_params_parse`) turns each image part into a text-like part
//!   `{"type": "media_marker", "text": get_media_marker()}`, the marker being
//!   `<__media_RANDOM__>`, random per process (`LLAMA_MEDIA_MARKER` pins it), so text a user
//!   sends cannot be taken for one;
//! - `common/chat.cpp` (`common_chat_msg::to_json_oaicompat`, `concat_content_parts`) gives a
//!   message with a marker to the template as one string: its parts in order, text parts
//!   joined with `\n`, but no `\n` before or after a marker (`a`, image, `b` is
//!   `a<marker>b`; `a`, `b` is `a\nb`). Templates that read typed content (Gemma 3's loops
//!   over `content` parts when it is a list) so see a string for such a message;
//! - the rendered prompt is then cut at each marker (mtmd's tokenizer), the text around
//!   tokenized, and each image's embeddings put at its marker, wrapped in the projector's
//!   own tokens (Gemma 3: `<start_of_image>` before, `<end_of_image>` after).
//!
//! The marker here is `<__sluice_image_RANDOM__>`, 20 random letters and digits drawn once
//! per process. A user who learned it (a rendered prompt shows it) could still write it in
//! text: [`split_checked`] refuses a prompt whose markers do not number its images.

use std::sync::OnceLock;

use rand::distributions::Alphanumeric;
use rand::Rng;

/// One part of a message's content, as [`join_parts`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartRef<'a> {
    Text(&'a str),
    Image,
}

/// A piece of a rendered prompt: text to tokenize, or the image of that index (in the order
/// the conversation holds the images).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    Image(usize),
}

/// This process's image marker.
pub fn marker() -> &'static str {
    static MARKER: OnceLock<String> = OnceLock::new();
    MARKER.get_or_init(|| {
        let random: String = rand::thread_rng()
            .sample_iter(&Alphanumeric)
            .take(20)
            .map(char::from)
            .collect();
        format!("<__sluice_image_{random}__>")
    })
}

/// A message's content as its template sees it: text parts joined with `\n`, none before or
/// after an image's marker (llama.cpp's rule, [module docs](self)).
pub fn join_parts<'a>(parts: impl IntoIterator<Item = PartRef<'a>>) -> String {
    let mut text = String::new();
    let mut after_image = false;
    for part in parts {
        match part {
            PartRef::Text(t) => {
                if !after_image && !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
                after_image = false;
            }
            PartRef::Image => {
                text.push_str(marker());
                after_image = true;
            }
        }
    }
    text
}

/// The rendered prompt cut at each marker: its text pieces (empty ones left out) and image
/// indices, in order.
pub fn split_at_markers(rendered: &str) -> Vec<Piece<'_>> {
    let marker = marker();
    let mut pieces = Vec::new();
    let mut image = 0;
    let mut rest = rendered;
    while let Some(at) = rest.find(marker) {
        if at > 0 {
            pieces.push(Piece::Text(&rest[..at]));
        }
        pieces.push(Piece::Image(image));
        image += 1;
        rest = &rest[at + marker.len()..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    pieces
}

/// How many markers `rendered` holds.
pub fn count_markers(rendered: &str) -> usize {
    rendered.matches(marker()).count()
}

/// [`split_at_markers`], refusing a prompt whose markers are not exactly `images`: text that
/// holds the marker itself, or a template that dropped a message with an image, would put
/// images where they were not sent.
pub fn split_checked(rendered: &str, images: usize) -> Result<Vec<Piece<'_>>, MarkerMismatch> {
    let pieces = split_at_markers(rendered);
    let found = pieces
        .iter()
        .filter(|p| matches!(p, Piece::Image(_)))
        .count();
    if found != images {
        return Err(MarkerMismatch { found, images });
    }
    Ok(pieces)
}

/// A rendered prompt whose image markers do not number its images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the prompt as the chat template renders it has {found} image markers for {images} images: \
     the template left an image out, or a message's text holds this server's image marker"
)]
pub struct MarkerMismatch {
    pub found: usize,
    pub images: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use PartRef::{Image, Text};

    #[test]
    fn parts_join_as_llama_cpp_joins_them() {
        let m = marker();
        assert!(m.starts_with("<__sluice_image_") && m.len() == 39, "{m}");
        assert_eq!(marker(), m, "one marker per process");
        assert_eq!(join_parts([Text("a"), Text("b")]), "a\nb");
        assert_eq!(join_parts([Text("a"), Image, Text("b")]), format!("a{m}b"));
        assert_eq!(
            join_parts([Image, Image, Text("b"), Text("c"), Image]),
            format!("{m}{m}b\nc{m}")
        );
        assert_eq!(join_parts([Text(""), Text("b")]), "b");
        assert_eq!(join_parts([]), "");
    }

    #[test]
    fn a_prompt_splits_at_its_markers() {
        let m = marker();
        let prompt = format!("<user>{m}What is it?{m}{m}</user>");
        assert_eq!(
            split_at_markers(&prompt),
            [
                Piece::Text("<user>"),
                Piece::Image(0),
                Piece::Text("What is it?"),
                Piece::Image(1),
                Piece::Image(2),
                Piece::Text("</user>"),
            ]
        );
        assert_eq!(split_at_markers("plain"), [Piece::Text("plain")]);
        assert_eq!(split_at_markers(""), []);
        assert_eq!(count_markers(&prompt), 3);
        assert!(split_checked(&prompt, 3).is_ok());
        assert_eq!(
            split_checked(&prompt, 2),
            Err(MarkerMismatch {
                found: 3,
                images: 2
            })
        );
        // Lookalikes of llama.cpp's marker or another process's are plain text.
        let other = "<__media__><__sluice_image_AAAAAAAAAAAAAAAAAAAA__>";
        assert_eq!(split_at_markers(other), [Piece::Text(other)]);
    }
}
