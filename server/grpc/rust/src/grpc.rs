//! What tonic leaves to us on the gRPC side, kept to grpc-core's behaviour (Triton's server is grpc-core, and
//! grpc.aio, the other transport, too): the raw-bytes codec, the `grpc-timeout` and `grpc-encoding` checks,
//! the metadata hard limit, and grpc-core's statuses and texts for the refusals tonic words differently.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method, Uri};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// grpc-core's answer to a method the server does not have (UNIMPLEMENTED).
pub const METHOD_NOT_FOUND: &str = "Method not found!";
/// The request encodings this transport decodes, as grpc-core lists them.
pub const ACCEPT_ENCODING: &str = "identity, deflate, gzip";
/// The gRPC headers looked up or set on every call, as names (a `&str` key is parsed again at each use).
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
pub const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
pub const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// grpc-core's refusal of a `grpc-timeout` it cannot parse (INTERNAL).
pub const BAD_TIMEOUT: &str = "Error parsing 'grpc-timeout' metadata";
/// grpc-core's refusal of a `grpc-encoding` it does not know (INTERNAL, while parsing the metadata).
pub const BAD_ENCODING: &str = "Error parsing 'grpc-encoding' metadata";

/// Messages are handed over as they are: Python parses and serializes them.
#[derive(Clone, Copy, Default)]
pub struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> BytesCodec {
        BytesCodec
    }

    fn decoder(&mut self) -> BytesCodec {
        BytesCodec
    }
}

/// The buffers tonic starts a call's decoding and encoding with: inference messages are often small, and a
/// larger one reserves its exact size once its length is known (tonic's default starts each call at 8 KiB).
fn buffer_settings() -> BufferSettings {
    BufferSettings::new(1024, 32 * 1024)
}

impl Encoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

impl Decoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

/// `grpc-timeout` (gRPC's PROTOCOL-HTTP2.md: up to 8 digits and a unit of H M S m u n), as grpc-core reads it:
/// `Ok(None)` without one, and also for a value past 8 digits or too large for a `Duration` (grpc-core serves
/// those calls without a deadline); `Err` for anything else that is not digits and a unit.
pub fn parse_timeout(value: Option<&HeaderValue>) -> Result<Option<Duration>, ()> {
    let Some(value) = value else { return Ok(None) };
    let bytes = value.as_bytes();
    let Some((&unit, digits)) = bytes.split_last() else {
        return Err(());
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    let nanos_per_unit: u64 = match unit {
        b'H' => 3_600_000_000_000,
        b'M' => 60_000_000_000,
        b'S' => 1_000_000_000,
        b'm' => 1_000_000,
        b'u' => 1_000,
        b'n' => 1,
        _ => return Err(()),
    };
    if digits.len() > 8 {
        return Ok(None);
    }
    let count = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    // 8 digits of hours is 3.6e20 ns, past u64: seconds then, which never overflow here
    Ok(Some(match count.checked_mul(nanos_per_unit) {
        Some(nanos) => Duration::from_nanos(nanos),
        None => Duration::from_secs(count * (nanos_per_unit / 1_000_000_000)),
    }))
}

/// A call's `grpc-encoding` is one this transport decodes (none, identity, gzip, deflate).
pub fn encoding_known(headers: &HeaderMap) -> bool {
    matches!(
        headers.get(GRPC_ENCODING).map(HeaderValue::as_bytes),
        None | Some(b"identity" | b"gzip" | b"deflate")
    )
}

/// grpc-core's hard metadata limit and its message (RESOURCE_EXHAUSTED), so clients see what grpc.aio says:
/// HPACK sizes (name + value + 32 per entry, the pseudo-headers too).
pub fn metadata_too_large(method: &Method, uri: &Uri, headers: &HeaderMap, limit: usize) -> Option<String> {
    let authority = uri.authority().map(|a| a.as_str().len()).unwrap_or(0);
    let scheme = uri.scheme_str().map(str::len).unwrap_or(4);
    // the usual case, without building the list the refusal names
    let pseudo = 5 + uri.path().len() + 10 + authority + 7 + method.as_str().len() + 7 + scheme + 4 * 32;
    let all = headers.iter().try_fold(pseudo, |size, (name, value)| {
        (value.len() <= limit).then_some(size + name.as_str().len() + value.len() + 32)
    });
    if all.is_some_and(|size| size <= limit) {
        return None;
    }
    let mut entries: Vec<(&str, usize)> = vec![
        (":path", 5 + uri.path().len() + 32),
        (":authority", 10 + authority + 32),
        (":method", 7 + method.as_str().len() + 32),
        (":scheme", 7 + scheme + 32),
    ];
    for (name, value) in headers {
        if value.len() > limit {
            return Some(format!(
                "received metadata size exceeds hard limit (value length {} vs. {limit})",
                value.len()
            ));
        }
        entries.push((name.as_str(), name.as_str().len() + value.len() + 32));
    }
    let size: usize = entries.iter().map(|(_, n)| n).sum();
    if size <= limit {
        return None;
    }
    let list: Vec<String> = entries.iter().map(|(k, n)| format!("{k}:{n}B")).collect();
    Some(format!(
        "received metadata size exceeds hard limit ({size} vs. {limit});  {}",
        list.join(" ")
    ))
}

/// grpc-core's refusal of a response over the limit: the call fails, the message is not sent.
pub fn sent_too_large(length: usize, max: usize) -> String {
    format!("SERVER: Sent message larger than max ({length} vs. {max})")
}

/// grpc-core's status for a refusal tonic's decoder words its own way (None: tonic's is kept). tonic's texts are
/// pinned by this module's tests, which feed requests through tonic's own decoder.
pub fn grpc_core_status(status: &Status) -> Option<Status> {
    let message = status.message();
    match status.code() {
        Code::OutOfRange => {
            // "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
            let rest = message.strip_prefix("Error, decoded message length too large: found ")?;
            let (length, rest) = rest.split_once(" bytes, the limit is: ")?;
            let limit = rest.strip_suffix(" bytes")?;
            Some(Status::resource_exhausted(format!(
                "SERVER: Received message larger than max ({length} vs. {limit})"
            )))
        }
        Code::ResourceExhausted if message.starts_with("Error decompressing: size limit") => {
            Some(Status::resource_exhausted("Decompressed message larger than max"))
        }
        Code::Internal if message.starts_with("protocol error: received message with compressed-flag but no") => {
            Some(Status::internal("Compression bit set but no encoding configured"))
        }
        Code::Internal if message.starts_with("Error decompressing: ") => {
            Some(Status::internal("Decompression failed due to zlib error"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    use flate2::write::{GzEncoder, ZlibEncoder};
    use tokio_stream::StreamExt;
    use tonic::codec::{CompressionEncoding, Streaming};

    fn value(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn timeouts_in_every_unit() {
        let cases = [
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("3S", Duration::from_secs(3)),
            ("4m", Duration::from_millis(4)),
            ("5u", Duration::from_micros(5)),
            ("6n", Duration::from_nanos(6)),
            ("00000010S", Duration::from_secs(10)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_timeout(Some(&value(text))), Ok(Some(expected)), "{text}");
        }
        assert_eq!(parse_timeout(None), Ok(None));
    }

    #[test]
    fn the_largest_timeouts_never_overflow() {
        let hours = parse_timeout(Some(&value("99999999H"))).unwrap().unwrap();
        assert_eq!(hours, Duration::from_secs(99_999_999 * 3600));
        // past 8 digits grpc-core serves the call without a deadline (it never panics, nor do we)
        for text in ["100000000S", "9999999999999999H", "99999999999999999999999999H"] {
            assert_eq!(parse_timeout(Some(&value(text))), Ok(None), "{text}");
        }
    }

    #[test]
    fn malformed_timeouts_are_refused() {
        for text in ["", "S", "1", "1x", "abc", "-1S", "1.5S", " 1S", "1 S", "１S"] {
            let header = HeaderValue::from_bytes(text.as_bytes()).unwrap();
            assert_eq!(parse_timeout(Some(&header)), Err(()), "{text:?}");
        }
    }

    #[test]
    fn encodings() {
        let mut headers = HeaderMap::new();
        assert!(encoding_known(&headers));
        for known in ["identity", "gzip", "deflate"] {
            headers.insert("grpc-encoding", value(known));
            assert!(encoding_known(&headers), "{known}");
        }
        for unknown in ["snappy", "zstd", "GZIP", ""] {
            headers.insert("grpc-encoding", value(unknown));
            assert!(!encoding_known(&headers), "{unknown}");
        }
    }

    #[test]
    fn metadata_limits_count_hpack_sizes_as_grpc_core_does() {
        let uri: Uri = "http://h:1/inference.GRPCInferenceService/ServerLive".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("te", value("trailers"));
        // pseudo-headers: 5+42+32 + 10+3+32 + 7+4+32 + 7+4+32 = 210; te: 2+8+32 = 42
        assert_eq!(metadata_too_large(&Method::POST, &uri, &headers, 252), None);
        let refused = metadata_too_large(&Method::POST, &uri, &headers, 251).unwrap();
        assert!(
            refused.starts_with("received metadata size exceeds hard limit (252 vs. 251);  :path:79B"),
            "{refused}"
        );
        assert!(refused.ends_with(" te:42B"), "{refused}");
        headers.insert("x-big", value(&"v".repeat(300)));
        assert_eq!(
            metadata_too_large(&Method::POST, &uri, &headers, 299).unwrap(),
            "received metadata size exceeds hard limit (value length 300 vs. 299)"
        );
    }

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    /// The first message (or status) tonic's server-side decoder makes of `body`, with our codec and limits.
    async fn decode(body: Vec<u8>, encoding: Option<&str>, max: usize) -> Result<Option<Bytes>, Status> {
        // what tonic's server makes of the grpc-encoding header, for the encodings it accepts
        let encoding = match encoding {
            Some("gzip") => Some(CompressionEncoding::Gzip),
            Some("deflate") => Some(CompressionEncoding::Deflate),
            _ => None,
        };
        let body = http_body_util::Full::new(Bytes::from(body));
        let mut stream = Streaming::new_request(BytesCodec.decoder(), body, encoding, Some(max));
        stream.next().await.transpose()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn mapped(status: Status) -> (Code, String) {
        let status = grpc_core_status(&status).unwrap_or(status);
        (status.code(), status.message().to_owned())
    }

    #[tokio::test]
    async fn framing_hands_over_each_message_as_sent() {
        let message = b"\x08\x01 raw protobuf bytes";
        assert_eq!(
            decode(framed(0, message), None, 64).await.unwrap().unwrap(),
            &message[..]
        );
        assert_eq!(decode(framed(0, b""), None, 64).await.unwrap().unwrap(), &b""[..]);
        assert_eq!(decode(Vec::new(), None, 64).await.unwrap(), None);
        let cut = framed(0, message)[..10].to_vec();
        let status = decode(cut, None, 64).await.unwrap_err();
        assert_eq!(status.code(), Code::Internal);
    }

    #[tokio::test]
    async fn the_size_limit_holds_on_the_wire_with_grpc_cores_text() {
        assert!(decode(framed(0, &[7; 64]), None, 64).await.is_ok());
        let status = decode(framed(0, &[7; 65]), None, 64).await.unwrap_err();
        assert_eq!(
            mapped(status),
            (
                Code::ResourceExhausted,
                "SERVER: Received message larger than max (65 vs. 64)".into()
            )
        );
    }

    #[tokio::test]
    async fn compressed_messages_are_decoded_and_limited_once_decompressed() {
        let data = vec![b'x'; 1000];
        for (encoding, compressed) in [("gzip", gzip(&data)), ("deflate", zlib(&data))] {
            let got = decode(framed(1, &compressed), Some(encoding), 1000)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, data, "{encoding}");
            let status = decode(framed(1, &compressed), Some(encoding), 999).await.unwrap_err();
            assert_eq!(
                mapped(status),
                (Code::ResourceExhausted, "Decompressed message larger than max".into()),
                "{encoding}"
            );
        }
    }

    #[tokio::test]
    async fn undecodable_compressed_messages_get_grpc_cores_statuses() {
        let status = decode(framed(1, &gzip(b"")), None, 64).await.unwrap_err();
        assert_eq!(
            mapped(status),
            (Code::Internal, "Compression bit set but no encoding configured".into())
        );
        let status = decode(framed(1, &gzip(b"")), Some("identity"), 64).await.unwrap_err();
        assert_eq!(
            mapped(status),
            (Code::Internal, "Compression bit set but no encoding configured".into())
        );
        let status = decode(framed(1, &gzip(b"")), Some("deflate"), 64).await.unwrap_err();
        assert_eq!(
            mapped(status),
            (Code::Internal, "Decompression failed due to zlib error".into())
        );
    }

    #[test]
    fn other_statuses_are_kept() {
        for status in [
            Status::internal("anything"),
            Status::out_of_range("a model's own message"),
            Status::resource_exhausted("a model's own message"),
        ] {
            assert!(grpc_core_status(&status).is_none(), "{status:?}");
        }
    }
}
