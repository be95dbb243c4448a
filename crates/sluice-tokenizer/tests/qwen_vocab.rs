//! Qwen2.5's tool-call tags are ordinary text to the tokenizer: `<tool_call>` (151657) and
//! `</tool_call>` (151658) are user-defined added tokens, not control tokens, so decoding with
//! `skip_special_tokens` keeps them and the tool parser sees them; `<|im_end|>` stays special.
//! Read from the real GGUF when `models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` is there
//! (`scripts/fetch-qwen.sh`); otherwise the test says it skipped and passes.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use sluice_tokenizer::{ChatTemplate, MetadataMap, MetadataValue, Tokenizer, ToolCallFormat};

const GGUF: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

fn optional_model(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: models/{name} missing, run scripts/fetch-qwen.sh");
        None
    }
}

/// The metadata of a GGUF file (this crate has no GGUF reader: the model crate owns it, and
/// depends on this one). Reads the header only, never the tensors.
fn read_gguf_metadata(path: &Path) -> MetadataMap {
    let mut reader = BufReader::new(File::open(path).unwrap());
    let mut magic = [0u8; 4];
    reader.read_exact(&mut magic).unwrap();
    assert_eq!(&magic, b"GGUF");
    let version = read_u32(&mut reader);
    assert!(version >= 2, "GGUF v{version}");
    let _tensor_count = read_u64(&mut reader);
    let kv_count = read_u64(&mut reader);
    let mut metadata = MetadataMap::new();
    for _ in 0..kv_count {
        let key = read_string(&mut reader);
        let value_type = read_u32(&mut reader);
        let value = read_value(&mut reader, value_type);
        metadata.insert(key, value);
    }
    metadata
}

fn read_value(reader: &mut impl Read, value_type: u32) -> MetadataValue {
    let mut bytes = |n: usize| {
        let mut buf = vec![0u8; n];
        reader.read_exact(&mut buf).unwrap();
        buf
    };
    match value_type {
        0 => MetadataValue::Int(bytes(1)[0] as i64),
        1 => MetadataValue::Int(bytes(1)[0] as i8 as i64),
        2 => MetadataValue::Int(u16::from_le_bytes(bytes(2).try_into().unwrap()) as i64),
        3 => MetadataValue::Int(i16::from_le_bytes(bytes(2).try_into().unwrap()) as i64),
        4 => MetadataValue::Int(u32::from_le_bytes(bytes(4).try_into().unwrap()) as i64),
        5 => MetadataValue::Int(i32::from_le_bytes(bytes(4).try_into().unwrap()) as i64),
        6 => MetadataValue::Float(f32::from_le_bytes(bytes(4).try_into().unwrap()) as f64),
        7 => MetadataValue::Bool(bytes(1)[0] != 0),
        8 => MetadataValue::String(read_string(reader)),
        9 => {
            let item_type = read_u32(reader);
            let count = read_u64(reader);
            MetadataValue::Array((0..count).map(|_| read_value(reader, item_type)).collect())
        }
        10 => MetadataValue::Int(u64::from_le_bytes(bytes(8).try_into().unwrap()) as i64),
        11 => MetadataValue::Int(i64::from_le_bytes(bytes(8).try_into().unwrap())),
        12 => MetadataValue::Float(f64::from_le_bytes(bytes(8).try_into().unwrap())),
        other => panic!("unknown GGUF value type {other}"),
    }
}

fn read_u32(reader: &mut impl Read) -> u32 {
    let mut buf = [0u8; 4];
    reader.read_exact(&mut buf).unwrap();
    u32::from_le_bytes(buf)
}

fn read_u64(reader: &mut impl Read) -> u64 {
    let mut buf = [0u8; 8];
    reader.read_exact(&mut buf).unwrap();
    u64::from_le_bytes(buf)
}

fn read_string(reader: &mut impl Read) -> String {
    let length = read_u64(reader) as usize;
    let mut buf = vec![0u8; length];
    reader.read_exact(&mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}

#[test]
fn qwen_tool_call_tags_are_text_and_im_end_is_special() {
    let Some(path) = optional_model(GGUF) else {
        return;
    };
    let metadata = read_gguf_metadata(&path);
    let tokenizer = Tokenizer::from_gguf(&metadata, &path).unwrap();
    let opening = tokenizer.token_to_id("<tool_call>").unwrap();
    let closing = tokenizer.token_to_id("</tool_call>").unwrap();
    assert_eq!((opening, closing), (151657, 151658));
    assert!(!tokenizer.is_special(opening) && !tokenizer.is_special(closing));
    assert_eq!(tokenizer.decode(&[opening], true), "<tool_call>");
    assert_eq!(tokenizer.decode(&[closing], true), "</tool_call>");
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    assert!(tokenizer.is_special(im_end));
    assert_eq!(tokenizer.decode(&[im_end], true), "");
    // The tag in text encodes to its single id, so the prompt shows the model its own token.
    assert_eq!(tokenizer.encode("<tool_call>").unwrap(), vec![opening]);

    // Qwen's own template renders tools itself, in the Hermes format the parser reads.
    let template = ChatTemplate::new(tokenizer.chat_template().unwrap(), None, None).unwrap();
    assert!(template.renders_tools());
    assert_eq!(template.tool_call_format(), ToolCallFormat::Hermes);
}

#[test]
fn qwen_template_renders_tools_and_history_as_hugging_face_does() {
    let Some(path) = optional_model(GGUF) else {
        return;
    };
    let metadata = read_gguf_metadata(&path);
    let tokenizer = Tokenizer::from_gguf(&metadata, &path).unwrap();
    let template = ChatTemplate::new(tokenizer.chat_template().unwrap(), None, None).unwrap();
    // Key order, `<>&'`, non-ASCII and a float default must come out as json.dumps writes them.
    let tool_text = r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'later' in °C", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1.0}}, "required": ["city"]}}}"#;
    let tools = [serde_json::from_str::<serde_json::Value>(tool_text).unwrap()];
    let messages: Vec<sluice_tokenizer::ChatMessage> = serde_json::from_str(
        r#"[{"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
            {"role": "tool", "content": "{\"temp\": 21.5}", "tool_call_id": "call_1"}]"#,
    )
    .unwrap();
    let options = sluice_tokenizer::RenderOptions {
        add_generation_prompt: true,
        tools: Some(&tools),
        kwargs: None,
    };
    let prompt = template.render_with(&messages, &options).unwrap();
    // For a byte-for-byte comparison with Python's jinja2 rendering the same template by hand.
    if let Ok(out) = std::env::var("SLUICE_DUMP_QWEN_PROMPT") {
        std::fs::write(out, &prompt).unwrap();
    }
    assert!(
        prompt.contains(&format!("<tools>\n{tool_text}\n</tools>")),
        "{prompt}"
    );
    assert!(prompt.contains(
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n</tool_call><|im_end|>\n"
    ), "{prompt}");
    assert!(prompt.ends_with(
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21.5}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ), "{prompt}");
}
