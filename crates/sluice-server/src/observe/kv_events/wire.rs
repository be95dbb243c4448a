//! KV-event batches in vLLM's wire format: each ZMQ message is three frames, the topic, the
//! batch's sequence number (8 bytes, big-endian) and the batch as MessagePack, encoded like
//! vLLM's msgspec structs (`array_like`, tagged): `[timestamp, [event, ...], data_parallel_rank]`
//! with
//!
//! ```text
//! ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size, lora_id: nil, medium, lora_name: nil]
//! ["BlockRemoved", [hash, ...], medium]
//! ["AllBlocksCleared"]
//! ```
//!
//! which is what llm-d's and Dynamo's vLLM subscribers decode.

use rmp::encode::{self as mp, ByteBuf};
use sluice_engine::{KvCacheEvent, KvEventBatch};

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
pub fn encode_batch(batch: &KvEventBatch, block_size: usize, medium: Medium) -> Vec<u8> {
    let tokens: usize = batch
        .events
        .iter()
        .map(|e| match e {
            KvCacheEvent::Stored { token_ids, .. } => token_ids.len(),
            _ => 0,
        })
        .sum();
    let mut buf = ByteBuf::with_capacity(32 + 16 * batch.events.len() + 5 * tokens);
    let w = &mut buf;
    // Writing to a ByteBuf cannot fail: its error type is uninhabited.
    let Ok(_) = mp::write_array_len(w, 3);
    let Ok(()) = mp::write_f64(w, batch.timestamp);
    let Ok(_) = mp::write_array_len(w, len32(batch.events.len()));
    for event in &batch.events {
        match event {
            KvCacheEvent::Stored {
                block_hashes,
                parent_block_hash,
                token_ids,
            } => {
                let Ok(_) = mp::write_array_len(w, 8);
                let Ok(()) = mp::write_str(w, "BlockStored");
                write_hashes(w, block_hashes);
                match parent_block_hash {
                    Some(h) => {
                        let Ok(_) = mp::write_uint(w, *h);
                    }
                    None => {
                        let Ok(()) = mp::write_nil(w);
                    }
                }
                let Ok(_) = mp::write_array_len(w, len32(token_ids.len()));
                for &t in token_ids {
                    let Ok(_) = mp::write_uint(w, u64::from(t));
                }
                let Ok(_) = mp::write_uint(w, block_size as u64);
                let Ok(()) = mp::write_nil(w); // lora_id: sluice serves no adapters
                let Ok(()) = mp::write_str(w, medium.as_str());
                let Ok(()) = mp::write_nil(w); // lora_name
            }
            KvCacheEvent::Removed { block_hashes } => {
                let Ok(_) = mp::write_array_len(w, 3);
                let Ok(()) = mp::write_str(w, "BlockRemoved");
                write_hashes(w, block_hashes);
                let Ok(()) = mp::write_str(w, medium.as_str());
            }
            KvCacheEvent::AllCleared => {
                let Ok(_) = mp::write_array_len(w, 1);
                let Ok(()) = mp::write_str(w, "AllBlocksCleared");
            }
        }
    }
    let Ok(_) = mp::write_uint(w, 0); // data_parallel_rank: one engine per server
    buf.into_vec()
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

    #[test]
    fn a_batch_encodes_as_vllm_s_array_like_structs() {
        let batch = KvEventBatch {
            seq: 5,
            timestamp: 1.5,
            events: vec![
                KvCacheEvent::Stored {
                    block_hashes: vec![1, u64::MAX],
                    parent_block_hash: None,
                    token_ids: vec![3, 300],
                },
                KvCacheEvent::Removed {
                    block_hashes: vec![1],
                },
                KvCacheEvent::AllCleared,
            ],
        };
        let bytes = encode_batch(&batch, 1, Medium::Cpu);
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
}
