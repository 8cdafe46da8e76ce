//! The race patches/h2-window-update-after-goaway.patch fixes, played against an h2 server with raw frames.
//!
//! A server's graceful shutdown sends GOAWAY(2^31-1) and a PING; on the PING's answer it sends GOAWAY(last
//! stream id processed). The client here opened stream 3 before it read the first GOAWAY and writes it after
//! the PING answer (as grpc C-core does: PING acks go ahead of queued streams), then a WINDOW_UPDATE for it.
//! h2 ignores the HEADERS of a stream above the final GOAWAY's id; an unpatched h2 takes its WINDOW_UPDATE for
//! a frame on an idle stream and fails the whole connection (GOAWAY PROTOCOL_ERROR), so stream 1, still open,
//! is never answered. Used by tests/h2_patch.rs (patched: the connection survives) and patches/canary (the
//! newest h2 on crates.io: the bug is still there).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::oneshot;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const ACK: u8 = 1;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;
const PROTOCOL_ERROR: u32 = 1;

/// What the client saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// the server failed the connection with GOAWAY(PROTOCOL_ERROR)
    pub protocol_error: bool,
    /// stream 1's response came
    pub answered: bool,
    /// the GOAWAY frames' (last stream id, error code)
    pub goaways: Vec<(u32, u32)>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A POST to `/` (HPACK: static-table :method POST, :scheme http, :path /; :authority "a" as a literal).
fn request(stream: u32) -> Vec<u8> {
    frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        stream,
        &[0x83, 0x86, 0x84, 0x01, 0x01, b'a'],
    )
}

async fn read_frame(io: &mut DuplexStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    io.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    io.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], stream, payload))
}

/// Plays the race against `h2::server` and says what the client saw.
pub async fn run() -> Outcome {
    let (mut client, server_io) = tokio::io::duplex(1 << 16);
    let (sent_tx, sent_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.expect("handshake");
        let (_request, mut respond) = conn.accept().await.expect("stream 1").expect("stream 1 accepted");
        conn.graceful_shutdown();
        let answer = async move {
            // stream 1 stays open until the client's late frames have been read
            let _ = sent_rx.await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = respond.send_response(http::Response::new(()), true);
        };
        let drive = async move { while let Some(Ok(_)) = conn.accept().await {} };
        tokio::join!(answer, drive);
    });

    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    hello.extend(request(1));
    client.write_all(&hello).await.unwrap();

    let mut outcome = Outcome::default();
    let mut sent = Some(sent_tx);
    let read = async {
        while let Some((kind, flags, stream, payload)) = read_frame(&mut client).await {
            match kind {
                SETTINGS if flags & ACK == 0 => client.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap(),
                PING if flags & ACK == 0 => {
                    // the shutdown PING: its answer first, then the stream opened before the GOAWAY was read
                    let mut late = frame(PING, ACK, 0, &payload);
                    late.extend(request(3));
                    late.extend(frame(WINDOW_UPDATE, 0, 3, &65_535u32.to_be_bytes()));
                    client.write_all(&late).await.unwrap();
                    if let Some(tx) = sent.take() {
                        let _ = tx.send(());
                    }
                }
                GOAWAY => {
                    let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
                    let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                    outcome.goaways.push((last, code));
                    outcome.protocol_error |= code == PROTOCOL_ERROR;
                }
                HEADERS | DATA if stream == 1 => outcome.answered = true,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the server closes the connection");
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    outcome
}
