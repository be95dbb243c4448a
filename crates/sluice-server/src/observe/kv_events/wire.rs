//! KV-event batches in vLLM's wire format: each ZMQ message is three frames, the topic, the
//! batch's sequence number (8 bytes, big-endian) and the batch as MessagePack: `[timestamp,
//! [event, ...], data_parallel_rank]`. An event is encoded as vLLM's msgspec structs are, tagged
//! by their type:
//!
//! - [`EventFormat::Map`] (the default, vLLM's format since June 2026, PR #42892): a map whose
//!   first key is `type`, then the fields by name, those left at their default (`extra_keys`,
//!   `group_idx`, `kv_cache_spec_kind`, ...) omitted as msgspec's `omit_defaults` omits them:
//!
//!   ```text
//!   {"type": "BlockStored", "block_hashes": [hash, ...], "parent_block_hash": hash | nil,
//!    "token_ids": [token_id, ...], "block_size": n, "lora_id": nil, "medium": m, "lora_name": nil}
//!   {"type": "BlockRemoved", "block_hashes": [hash, ...], "medium": m}
//!   {"type": "AllBlocksCleared"}
//!   ```
//!
//! - [`EventFormat::Array`] (`--kv-events-format array`, what subscribers written before it
//!   decode): the same fields by position, the tag first:
//!
//!   ```text
//!   ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size, lora_id: nil, medium, lora_name: nil]
//!   ["BlockRemoved", [hash, ...], medium]
//!   ["AllBlocksCleared"]
//!   ```
//!
//! llm-d's and Dynamo's vLLM subscribers decode both.

use rmp::encode::{self as mp, ByteBuf};
use sluice_engine::{KvCacheEvent, KvEventBatch};

/// How each event of a batch is laid out (the module's documentation shows both).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum EventFormat {
    /// A map of the fields by name, tagged by `type`: vLLM's current format.
    #[default]
    Map,
    /// The fields by position, the tag first: vLLM's format before June 2026.
    Array,
}

/// What vLLM's `medium` field says of where the blocks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Gpu,
    Cpu,
}

impl Medium {
    fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

/// The MessagePack payload of one batch.
pub fn encode_batch(
    batch: &KvEventBatch,
    block_size: usize,
    medium: Medium,
    format: EventFormat,
) -> Vec<u8> {
    let tokens: usize = batch
        .events
        .iter()
        .map(|e| match e {
            KvCacheEvent::Stored { token_ids, .. } => token_ids.len(),
            _ => 0,
        })
        .sum();
    let mut buf = ByteBuf::with_capacity(32 + 96 * batch.events.len() + 5 * tokens);
    let w = &mut buf;
    // Writing to a ByteBuf cannot fail: its error type is uninhabited.
    let Ok(_) = mp::write_array_len(w, 3);
    let Ok(()) = mp::write_f64(w, batch.timestamp);
    let Ok(_) = mp::write_array_len(w, len32(batch.events.len()));
    for event in &batch.events {
        let mut e = EventWriter { w, format };
        match event {
            KvCacheEvent::Stored {
                block_hashes,
                parent_block_hash,
                token_ids,
                lora_name,
            } => {
                e.open("BlockStored", 7);
                e.key("block_hashes");
                write_hashes(e.w, block_hashes);
                e.key("parent_block_hash");
                match parent_block_hash {
                    Some(h) => {
                        let Ok(_) = mp::write_uint(e.w, *h);
                    }
                    None => {
                        let Ok(()) = mp::write_nil(e.w);
                    }
                }
                e.key("token_ids");
                let Ok(_) = mp::write_array_len(e.w, len32(token_ids.len()));
                for &t in token_ids {
                    let Ok(_) = mp::write_uint(e.w, u64::from(t));
                }
                e.key("block_size");
                let Ok(_) = mp::write_uint(e.w, block_size as u64);
                // Routers key adapters' blocks by name; sluice's adapter ids are its own (one
                // per load), so none is published.
                e.key("lora_id");
                let Ok(()) = mp::write_nil(e.w);
                e.key("medium");
                let Ok(()) = mp::write_str(e.w, medium.as_str());
                e.key("lora_name");
                match lora_name {
                    Some(name) => {
                        let Ok(()) = mp::write_str(e.w, name);
                    }
                    None => {
                        let Ok(()) = mp::write_nil(e.w);
                    }
                }
            }
            KvCacheEvent::Removed { block_hashes } => {
                e.open("BlockRemoved", 2);
                e.key("block_hashes");
                write_hashes(e.w, block_hashes);
                e.key("medium");
                let Ok(()) = mp::write_str(e.w, medium.as_str());
            }
            KvCacheEvent::AllCleared => e.open("AllBlocksCleared", 0),
        }
    }
    let Ok(_) = mp::write_uint(w, 0); // data_parallel_rank: one engine per server
    buf.into_vec()
}

/// Writes one event's tag and field names as its [`EventFormat`] lays them out.
struct EventWriter<'a> {
    w: &'a mut ByteBuf,
    format: EventFormat,
}

impl EventWriter<'_> {
    /// The event's container, for `fields` fields besides the tag, and the tag.
    fn open(&mut self, tag: &str, fields: u32) {
        match self.format {
            EventFormat::Map => {
                let Ok(_) = mp::write_map_len(self.w, fields + 1);
                let Ok(()) = mp::write_str(self.w, "type");
            }
            EventFormat::Array => {
                let Ok(_) = mp::write_array_len(self.w, fields + 1);
            }
        }
        let Ok(()) = mp::write_str(self.w, tag);
    }

    /// The next field's name, where the format writes names.
    fn key(&mut self, name: &str) {
        if self.format == EventFormat::Map {
            let Ok(()) = mp::write_str(self.w, name);
        }
    }
}

fn write_hashes(w: &mut ByteBuf, hashes: &[u64]) {
    let Ok(_) = mp::write_array_len(w, len32(hashes.len()));
    for &h in hashes {
        let Ok(_) = mp::write_uint(w, h);
    }
}

/// A step's event count or token count is far below `u32::MAX`; saturate rather than wrap.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> KvEventBatch {
        KvEventBatch {
            seq: 5,
            timestamp: 1.5,
            events: vec![
                KvCacheEvent::Stored {
                    block_hashes: vec![1, u64::MAX],
                    parent_block_hash: None,
                    token_ids: vec![3, 300],
                    lora_name: None,
                },
                KvCacheEvent::Removed {
                    block_hashes: vec![1],
                },
                KvCacheEvent::AllCleared,
            ],
        }
    }

    #[test]
    fn a_batch_encodes_as_vllm_s_array_like_structs() {
        let batch = batch();
        let bytes = encode_batch(&batch, 1, Medium::Cpu, EventFormat::Array);
        let mut expected = vec![0x93, 0xcb];
        expected.extend_from_slice(&1.5f64.to_be_bytes());
        expected.push(0x93);
        // ["BlockStored", [1, u64::MAX], nil, [3, 300], 1, nil, "CPU", nil]
        expected.extend_from_slice(&[0x98, 0xab]);
        expected.extend_from_slice(b"BlockStored");
        expected.extend_from_slice(&[0x92, 0x01, 0xcf]);
        expected.extend_from_slice(&u64::MAX.to_be_bytes());
        expected.extend_from_slice(&[0xc0, 0x92, 0x03, 0xcd, 0x01, 0x2c, 0x01, 0xc0, 0xa3]);
        expected.extend_from_slice(b"CPU");
        expected.push(0xc0);
        // ["BlockRemoved", [1], "CPU"]
        expected.extend_from_slice(&[0x93, 0xac]);
        expected.extend_from_slice(b"BlockRemoved");
        expected.extend_from_slice(&[0x91, 0x01, 0xa3]);
        expected.extend_from_slice(b"CPU");
        // ["AllBlocksCleared"]
        expected.extend_from_slice(&[0x91, 0xb0]);
        expected.extend_from_slice(b"AllBlocksCleared");
        expected.push(0x00);
        assert_eq!(bytes, expected);
    }

    fn str_(s: &str) -> Vec<u8> {
        let mut out = vec![0xa0 | s.len() as u8];
        out.extend_from_slice(s.as_bytes());
        out
    }

    #[test]
    fn a_batch_encodes_as_vllm_s_tagged_maps() {
        let bytes = encode_batch(&batch(), 1, Medium::Gpu, EventFormat::Map);
        let mut expected = vec![0x93, 0xcb];
        expected.extend_from_slice(&1.5f64.to_be_bytes());
        expected.push(0x93);
        // {"type": "BlockStored", "block_hashes": [1, u64::MAX], "parent_block_hash": nil,
        //  "token_ids": [3, 300], "block_size": 1, "lora_id": nil, "medium": "GPU",
        //  "lora_name": nil}
        expected.push(0x88);
        for (key, value) in [
            ("type", str_("BlockStored")),
            ("block_hashes", {
                let mut v = vec![0x92, 0x01, 0xcf];
                v.extend_from_slice(&u64::MAX.to_be_bytes());
                v
            }),
            ("parent_block_hash", vec![0xc0]),
            ("token_ids", vec![0x92, 0x03, 0xcd, 0x01, 0x2c]),
            ("block_size", vec![0x01]),
            ("lora_id", vec![0xc0]),
            ("medium", str_("GPU")),
            ("lora_name", vec![0xc0]),
        ] {
            expected.extend(str_(key));
            expected.extend(value);
        }
        // {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}
        expected.push(0x83);
        for (key, value) in [
            ("type", str_("BlockRemoved")),
            ("block_hashes", vec![0x91, 0x01]),
            ("medium", str_("GPU")),
        ] {
            expected.extend(str_(key));
            expected.extend(value);
        }
        // {"type": "AllBlocksCleared"}
        expected.push(0x81);
        expected.extend(str_("type"));
        expected.extend(str_("AllBlocksCleared"));
        expected.push(0x00);
        assert_eq!(bytes, expected);
    }

    /// An adapter's blocks name it, in both formats: the last field of `BlockStored`.
    #[test]
    fn an_adapter_s_blocks_carry_its_name() {
        let batch = KvEventBatch {
            seq: 0,
            timestamp: 0.0,
            events: vec![KvCacheEvent::Stored {
                block_hashes: vec![7],
                parent_block_hash: Some(6),
                token_ids: vec![1],
                lora_name: Some("fr-support".into()),
            }],
        };
        for format in [EventFormat::Map, EventFormat::Array] {
            let bytes = encode_batch(&batch, 1, Medium::Cpu, format);
            let mut tail = match format {
                EventFormat::Map => str_("lora_name"),
                EventFormat::Array => Vec::new(),
            };
            tail.extend(str_("fr-support"));
            tail.push(0x00); // data_parallel_rank
            assert!(bytes.ends_with(&tail), "{format:?}: {bytes:02x?}");
        }
    }
}
