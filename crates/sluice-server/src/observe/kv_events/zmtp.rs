//! The part of ZMTP, ZeroMQ's wire protocol (version 3.0, rfc.zeromq.org/spec/23, with 3.1's
//! commands from spec 37), that a PUB and a ROUTER socket need under the NULL mechanism: the
//! greeting, the READY handshake, and framing. Enough for libzmq's SUB, DEALER and REQ
//! sockets (pyzmq, Go's zmq4) to talk to us; no CURVE, no PLAIN.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Frame flag bits.
const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

/// The largest frame a peer may send us: subscriptions and replay requests are a few bytes.
const MAX_INCOMING_FRAME: u64 = 64 * 1024;

/// Our greeting: signature, version 3.0, mechanism NULL, not a server (meaningless for NULL).
/// We say 3.0 so that libzmq peers send subscriptions in 3.0's message form; 3.1's
/// SUBSCRIBE/CANCEL commands are understood too.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[8] = 0x01;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// One frame read from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub more: bool,
    pub command: bool,
    pub body: Vec<u8>,
}

impl Frame {
    /// A command's name and data, when the frame is a well-formed command.
    pub fn command(&self) -> Option<(&[u8], &[u8])> {
        if !self.command {
            return None;
        }
        let (&len, rest) = self.body.split_first()?;
        let len = usize::from(len);
        (rest.len() >= len).then(|| rest.split_at(len))
    }
}

fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Appends one frame with `body` to `out`.
pub fn put_frame(out: &mut Vec<u8>, body: &[u8], more: bool) {
    put_frame_flags(out, body, if more { MORE } else { 0 });
}

fn put_frame_flags(out: &mut Vec<u8>, body: &[u8], flags: u8) {
    if body.len() <= 255 {
        out.push(flags);
        out.push(body.len() as u8);
    } else {
        out.push(flags | LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
}

/// Appends a command frame: `name` then `data`.
pub fn put_command(out: &mut Vec<u8>, name: &[u8], data: &[u8]) {
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(data);
    put_frame_flags(out, &body, COMMAND);
}

/// Appends a multipart message: every part but the last carries MORE.
pub fn put_message(out: &mut Vec<u8>, parts: &[&[u8]]) {
    for (i, part) in parts.iter().enumerate() {
        put_frame(out, part, i + 1 < parts.len());
    }
}

/// Reads one frame.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Frame> {
    let flags = r.read_u8().await?;
    if flags & !(MORE | LONG | COMMAND) != 0 {
        return Err(protocol_error(format!("bad frame flags {flags:#04x}")));
    }
    let len = if flags & LONG != 0 {
        r.read_u64().await?
    } else {
        u64::from(r.read_u8().await?)
    };
    if len > MAX_INCOMING_FRAME {
        return Err(protocol_error(format!("frame of {len} bytes is too large")));
    }
    let mut body = vec![0; len as usize];
    r.read_exact(&mut body).await?;
    Ok(Frame {
        more: flags & MORE != 0,
        command: flags & COMMAND != 0,
        body,
    })
}

/// Reads the frames of one message (skipping commands between messages, which `on_command`
/// sees).
pub async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    mut on_command: impl FnMut(&[u8], &[u8]),
) -> io::Result<Vec<Vec<u8>>> {
    let mut parts = Vec::new();
    loop {
        let frame = read_frame(r).await?;
        if frame.command {
            if let Some((name, data)) = frame.command() {
                on_command(name, data);
            }
            continue;
        }
        let more = frame.more;
        parts.push(frame.body);
        if !more {
            return Ok(parts);
        }
    }
}

/// The properties of a READY command: `name-len name value-len(4, big-endian) value`, repeated.
fn ready_properties(mut data: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut props = Vec::new();
    while !data.is_empty() {
        let bad = || protocol_error("malformed READY properties");
        let (&name_len, rest) = data.split_first().ok_or_else(bad)?;
        let name_len = usize::from(name_len);
        if rest.len() < name_len + 4 {
            return Err(bad());
        }
        let (name, rest) = rest.split_at(name_len);
        let (len, rest) = rest.split_at(4);
        let value_len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        if rest.len() < value_len {
            return Err(bad());
        }
        let (value, rest) = rest.split_at(value_len);
        props.push((name.to_vec(), value.to_vec()));
        data = rest;
    }
    Ok(props)
}

/// Greets the peer and exchanges READY commands as a `socket_type` socket; fails unless the
/// peer speaks ZMTP 3 with the NULL mechanism and is one of `peer_types`. Returns the peer's
/// socket type.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    socket_type: &str,
    peer_types: &[&str],
) -> io::Result<String> {
    stream.write_all(&greeting()).await?;
    let mut peer = [0u8; 64];
    stream.read_exact(&mut peer).await?;
    if peer[0] != 0xFF || peer[9] & 0x01 != 0x01 {
        return Err(protocol_error("not a ZMTP peer"));
    }
    if peer[10] < 3 {
        return Err(protocol_error(format!(
            "ZMTP {}.{} peer; 3.0 or later is needed",
            peer[10], peer[11]
        )));
    }
    let mechanism = &peer[12..32];
    let end = mechanism
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(mechanism.len());
    if &mechanism[..end] != b"NULL" {
        return Err(protocol_error(format!(
            "security mechanism {} is not supported (only NULL)",
            String::from_utf8_lossy(&mechanism[..end])
        )));
    }
    let mut ready = Vec::with_capacity(64);
    let mut props = Vec::with_capacity(32);
    props.push(b"Socket-Type".len() as u8);
    props.extend_from_slice(b"Socket-Type");
    props.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    props.extend_from_slice(socket_type.as_bytes());
    put_command(&mut ready, b"READY", &props);
    stream.write_all(&ready).await?;
    let frame = read_frame(stream).await?;
    let Some((b"READY", data)) = frame.command() else {
        return Err(protocol_error("the peer did not send READY"));
    };
    let peer_type = ready_properties(data)?
        .into_iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(b"Socket-Type"))
        .map(|(_, value)| String::from_utf8_lossy(&value).into_owned())
        .ok_or_else(|| protocol_error("READY without Socket-Type"))?;
    if !peer_types.contains(&peer_type.as_str()) {
        return Err(protocol_error(format!(
            "a {peer_type} socket cannot talk to a {socket_type} socket"
        )));
    }
    Ok(peer_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_short_long_and_commands() {
        let long = vec![7u8; 300];
        let mut wire = Vec::new();
        put_message(&mut wire, &[b"topic", &long]);
        put_command(&mut wire, b"PING", b"\x00\x0actx");
        put_frame(&mut wire, b"", false);
        let mut r = wire.as_slice();
        let f = read_frame(&mut r).await.unwrap();
        assert_eq!(
            (f.more, f.command, f.body.as_slice()),
            (true, false, &b"topic"[..])
        );
        let f = read_frame(&mut r).await.unwrap();
        assert_eq!((f.more, f.body.len()), (false, 300));
        let f = read_frame(&mut r).await.unwrap();
        assert_eq!(f.command(), Some((&b"PING"[..], &b"\x00\x0actx"[..])));
        assert!(read_frame(&mut r).await.unwrap().body.is_empty());
        assert!(read_frame(&mut r).await.is_err(), "end of input");
    }

    #[tokio::test]
    async fn bad_frames_are_errors_not_panics() {
        for wire in [
            &[0x80u8, 0][..],
            &[LONG, 0xff, 0, 0, 0, 0, 0, 0, 0][..],
            &[0, 5, 1][..],
        ] {
            let mut r = wire;
            assert!(read_frame(&mut r).await.is_err(), "{wire:?}");
        }
        assert!(ready_properties(b"\x0bSocket-Type\x00\x00\x00\x09SUB").is_err());
        assert!(ready_properties(b"\x20Socket").is_err());
    }

    #[tokio::test]
    async fn handshake_between_two_ends_names_the_peer_and_refuses_mismatches() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let (pa, pb) = tokio::join!(
            handshake(&mut a, "PUB", &["SUB", "XSUB"]),
            handshake(&mut b, "SUB", &["PUB"])
        );
        assert_eq!(pa.unwrap(), "SUB");
        assert_eq!(pb.unwrap(), "PUB");
        let (mut a, mut b) = tokio::io::duplex(1024);
        let (pa, _) = tokio::join!(
            handshake(&mut a, "PUB", &["SUB", "XSUB"]),
            handshake(&mut b, "PUSH", &["PULL"])
        );
        assert!(pa.unwrap_err().to_string().contains("PUSH"));
    }
}
