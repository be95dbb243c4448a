//! A chat message's `content`, shared by every chat-shaped API: its text and image parts in
//! order. Chat completions' shape is parsed here (a string, or `text` and `image_url` parts);
//! Anthropic's and the Responses API's translations build the same value. Whether the model
//! takes images is decided later, where the served model is known
//! ([`crate::chat::pipeline`]).

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::media::marker::{join_parts, PartRef};
use crate::media::{Detail, ImageInput, ImageSource};

/// A message's content: text and image parts, in the order sent. An absent or null content
/// is no parts (an empty text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageContent {
    parts: Vec<ContentPart>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentPart {
    Text(String),
    Image(ImageInput),
}

impl MessageContent {
    /// One text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            parts: vec![ContentPart::Text(text.into())],
        }
    }

    pub fn parts(&self) -> &[ContentPart] {
        &self.parts
    }

    pub fn push_text(&mut self, text: impl Into<String>) {
        self.parts.push(ContentPart::Text(text.into()));
    }

    pub fn push_image(&mut self, image: ImageInput) {
        self.parts.push(ContentPart::Image(image));
    }

    /// Prepends `prefix` to the first part's text (a text part before an image if the
    /// content starts with one).
    pub fn prefix_text(&mut self, prefix: &str) {
        match self.parts.first_mut() {
            Some(ContentPart::Text(t)) => t.insert_str(0, prefix),
            _ => self.parts.insert(0, ContentPart::Text(prefix.to_string())),
        }
    }

    pub fn images(&self) -> impl Iterator<Item = &ImageInput> {
        self.parts.iter().filter_map(|p| match p {
            ContentPart::Image(image) => Some(image),
            ContentPart::Text(_) => None,
        })
    }

    pub fn has_images(&self) -> bool {
        self.images().next().is_some()
    }

    /// The text the chat template sees: text parts joined as llama.cpp joins them, this
    /// process's marker where each image is ([`crate::media::marker`]).
    pub fn template_text(&self) -> String {
        join_parts(self.parts.iter().map(|p| match p {
            ContentPart::Text(t) => PartRef::Text(t),
            ContentPart::Image(_) => PartRef::Image,
        }))
    }

    /// Bytes the content keeps in memory, images included (a stored conversation counts it).
    pub fn size_bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                ContentPart::Text(t) => t.len(),
                ContentPart::Image(image) => image.source.size_bytes() + image.field.len(),
            })
            .sum()
    }

    /// Names each image's field `{prefix}.content[j].image_url`: parsing a message's content
    /// knows its part index `j`, not the message's place in the request.
    pub fn name_images(&mut self, prefix: &str) {
        for part in &mut self.parts {
            if let ContentPart::Image(image) = part {
                image.field = format!("{prefix}.{}", image.field);
            }
        }
    }
}

/// One part of chat completions' `content`, as sent. Its fields are parsed by serde so that an
/// error inside one names it (`messages[1].content[0].image_url.detail`).
#[derive(Deserialize)]
struct RawPart {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    image_url: Option<ImageUrl>,
}

/// `{"url": "data:..." | "https://...", "detail": "auto" | "low" | "high"}`.
#[derive(Deserialize)]
struct RawImageUrl {
    url: String,
    #[serde(default)]
    detail: Detail,
}

/// An `image_url` with its URL parsed, so a bad one is refused naming `image_url`.
#[derive(Deserialize)]
#[serde(try_from = "RawImageUrl")]
struct ImageUrl {
    source: ImageSource,
    detail: Detail,
}

impl TryFrom<RawImageUrl> for ImageUrl {
    type Error = crate::media::MediaError;

    fn try_from(raw: RawImageUrl) -> Result<Self, Self::Error> {
        Ok(Self {
            source: ImageSource::parse(&raw.url)?,
            detail: raw.detail,
        })
    }
}

/// A part checked and its image parsed; `Err` is the part's own error.
#[derive(Deserialize)]
#[serde(try_from = "RawPart")]
struct Part(ContentPart);

impl TryFrom<RawPart> for Part {
    type Error = String;

    fn try_from(raw: RawPart) -> Result<Self, String> {
        match raw.kind.as_deref() {
            Some("text") => match raw.text {
                Some(t) => Ok(Self(ContentPart::Text(t))),
                None => Err("a text part needs a string `text`".into()),
            },
            Some("image_url") => {
                let image = raw
                    .image_url
                    .ok_or("an image_url part needs an `image_url` object with a `url`")?;
                Ok(Self(ContentPart::Image(ImageInput {
                    source: image.source,
                    detail: image.detail,
                    // Completed to `content[j].image_url` by the content, and to the whole
                    // path by the request ([`MessageContent::name_images`]).
                    field: "image_url".into(),
                })))
            }
            Some(other) => Err(format!(
                "content parts of type `{other}` are not supported; send `text` and \
                 `image_url` parts"
            )),
            None => Err("each content part needs a `type`".into()),
        }
    }
}

const SHAPE: &str = "a string or a list of content parts ({\"type\": \"text\", \"text\": ...}, \
                     {\"type\": \"image_url\", \"image_url\": {\"url\": ...}})";

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = MessageContent;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(SHAPE)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(MessageContent::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(MessageContent::default())
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(MessageContent::text(s))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(MessageContent::text(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut content = MessageContent::default();
        let mut j = 0;
        while let Some(Part(mut part)) = seq.next_element::<Part>()? {
            if let ContentPart::Image(image) = &mut part {
                image.field = format!("content[{j}].image_url");
            }
            content.parts.push(part);
            j += 1;
        }
        Ok(content)
    }
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ContentVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(json: &str) -> Result<MessageContent, String> {
        let mut de = serde_json::Deserializer::from_str(json);
        serde_path_to_error::deserialize(&mut de)
            .map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }

    #[test]
    fn content_is_a_string_or_parts() {
        assert_eq!(content(r#""hi""#).unwrap().template_text(), "hi");
        assert_eq!(
            content(r#"[{"type":"text","text":"a"},{"type":"text","text":"b"}]"#)
                .unwrap()
                .template_text(),
            "a\nb"
        );
        let empty = content("null").unwrap();
        assert_eq!(
            (empty.template_text(), empty.parts().len()),
            (String::new(), 0)
        );
        for bad in [
            "5",
            "{}",
            "[5]",
            r#"[{"type":"text"}]"#,
            r#"[{"text":"a"}]"#,
            "[[[[]]]]",
        ] {
            assert!(content(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn image_parts_are_parsed_in_place() {
        let c = content(
            r#"[{"type":"text","text":"What is this?"},
                {"type":"image_url","image_url":{"url":"data:image/png;base64,aGk=","detail":"low"}},
                {"type":"text","text":"And this?"},
                {"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]"#,
        )
        .unwrap();
        let images: Vec<&ImageInput> = c.images().collect();
        assert_eq!(images.len(), 2);
        assert_eq!(images[0].field, "content[1].image_url");
        assert_eq!(images[0].detail, Detail::Low);
        assert!(
            matches!(&images[0].source, ImageSource::Data { bytes, .. } if &bytes[..] == b"hi")
        );
        assert_eq!(images[1].field, "content[3].image_url");
        assert_eq!(images[1].detail, Detail::Auto);
        assert!(matches!(images[1].source, ImageSource::Url(_)));
        let m = crate::media::marker::marker();
        assert_eq!(c.template_text(), format!("What is this?{m}And this?{m}"));
        let mut named = c.clone();
        named.name_images("messages[2]");
        assert_eq!(
            named.images().next().unwrap().field,
            "messages[2].content[1].image_url"
        );
    }

    /// Each bad part is refused naming the part or the field inside it.
    #[test]
    fn bad_parts_name_where_they_are_wrong() {
        let cases = [
            (
                r#"[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x","detail":"ultra"}}]"#,
                "[1].image_url.detail",
                "ultra",
            ),
            (
                r#"[{"type":"image_url","image_url":{"url":"ftp://host/a.png"}}]"#,
                "[0].image_url",
                "not an image URL",
            ),
            (
                r#"[{"type":"image_url","image_url":{"url":"data:image/png;base64,%%%"}}]"#,
                "[0].image_url",
                "base64",
            ),
            (
                r#"[{"type":"image_url","image_url":{}}]"#,
                "[0].image_url",
                "url",
            ),
            (r#"[{"type":"image_url"}]"#, "[0]", "image_url"),
            (
                r#"[{"type":"input_audio","input_audio":{}}]"#,
                "[0]",
                "`input_audio`",
            ),
        ];
        for (json, path, words) in cases {
            let e = content(json).unwrap_err();
            assert!(e.starts_with(path), "{json}: {e}");
            assert!(e.contains(words), "{json}: {e}");
        }
    }

    #[test]
    fn error_prefixes_and_sizes() {
        let mut c =
            content(r#"[{"type":"image_url","image_url":{"url":"data:image/png;base64,aGk="}}]"#)
                .unwrap();
        c.prefix_text("Error: ");
        let m = crate::media::marker::marker();
        assert_eq!(c.template_text(), format!("Error: {m}"));
        let mut t = MessageContent::text("failed");
        t.prefix_text("Error: ");
        assert_eq!(t.template_text(), "Error: failed");
        assert!(c.size_bytes() >= 2);
    }
}
