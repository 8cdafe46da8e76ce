//! A gRPC transport for Python: HTTP/2 and gRPC framing in Rust (hyper on a tokio runtime in
//! background threads), each unary call handed to Python's event loop as raw bytes.
//!
//! The hand-off is where the CPU goes, so it is built to be cheap:
//! - tokio threads never take the GIL. A call (method index, message bytes, headers, timeout, a oneshot
//!   sender) goes into a mutex-guarded queue; an eventfd is written only when the queue goes from empty
//!   to non-empty, so a busy event loop is woken once for many calls.
//! - Python (`Transport.take`, registered with `loop.add_reader` on `Transport.fd`) drains the whole
//!   queue in one GIL acquisition and gets `(call, method_index, payload)` tuples.
//! - `PendingCall.reply(bytes)` / `.abort(code, message)` complete the oneshot without blocking; the
//!   tokio task that waits on it writes the response (one DATA frame and the trailers, or trailers-only).
//! - Deadlines (`grpc-timeout`) are enforced here: DEADLINE_EXCEEDED at the deadline, whatever Python
//!   does. A client that resets its stream drops the waiting task; `PendingCall.cancelled()` says so.
//! - Bidirectional streams (ModelStreamInfer): the call is handed over at once with no payload; each
//!   request message is read only when Python asks for one (`PendingCall.want`), so a handler that stops
//!   reading holds the client back by HTTP/2 flow control, and comes out of `take` with the call's id.
//!   Python writes messages (`send`) and ends with a status (`finish` / `abort`); they are written as sent.
//!   At most `BACKLOG` of a stream's messages wait here for the client to read them: beyond that `full()`
//!   says so and Python waits until the stream's id comes out of `take` as writable.
//! - Compressed requests (`grpc-encoding: gzip | deflate`, flag byte 1) are decompressed here, the size limit
//!   applying to the message as sent and again as decompressed, with grpc-core's statuses and texts;
//!   answers with headers advertise `grpc-accept-encoding`. Responses are never compressed, which gRPC
//!   allows (an answer without `grpc-encoding` is identity to the client).
//! - Connections end gracefully (max connection age, stop): GOAWAY, the streams open finish, then a lingering
//!   close (`Socket`). h2 is vendored with a fix for a WINDOW_UPDATE that races the GOAWAY (vendor/README.md).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::Read;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::read::{GzDecoder, ZlibDecoder};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

// gRPC status codes used by the transport itself
const INTERNAL: u32 = 13;
const UNIMPLEMENTED: u32 = 12;
const RESOURCE_EXHAUSTED: u32 = 8;
const DEADLINE_EXCEEDED: u32 = 4;
const UNAVAILABLE: u32 = 14;

/// grpc-core's answer to a method the server does not have (UNIMPLEMENTED).
const METHOD_NOT_FOUND: &str = "Method not found!";

/// A stream's messages sent by Python and not yet taken by HTTP/2 (which takes them as the client's flow
/// control window allows): past this many, Python waits (`PendingCall.full`). A reader that keeps up never
/// lets them pile up; one that reads slowly holds at most this many here, as grpc.aio holds one per write.
const BACKLOG: usize = 8;

/// The request encodings this transport decodes, as grpc-core lists them.
const ACCEPT_ENCODING: &str = "identity, deflate, gzip";
/// Compressed messages larger than this are inflated on tokio's blocking pool, not the (one) worker thread.
const INFLATE_INLINE: usize = 64 * 1024;

/// A call's `grpc-encoding`: how its compressed messages (flag byte 1) are decoded.
#[derive(Clone, Copy)]
enum Encoding {
    Identity,
    Gzip,
    /// gRPC's "deflate" is the zlib format (RFC 1950), as grpc-core writes it
    Deflate,
}

impl Encoding {
    /// None: an encoding this transport does not decode (grpc-core answers INTERNAL while parsing metadata).
    fn of(headers: &HeaderMap) -> Option<Encoding> {
        match headers.get("grpc-encoding").map(|v| v.as_bytes()) {
            None | Some(b"identity") => Some(Encoding::Identity),
            Some(b"gzip") => Some(Encoding::Gzip),
            Some(b"deflate") => Some(Encoding::Deflate),
            Some(_) => None,
        }
    }
}

/// A refusal: a gRPC status and its message.
type Refusal = (u32, String);

/// grpc-core's refusal of a response over the limit: the call fails, the message is not sent.
fn sent_too_large(length: usize, max: usize) -> String {
    format!("SERVER: Sent message larger than max ({length} vs. {max})")
}

fn too_large(length: usize, max: usize) -> Refusal {
    (
        RESOURCE_EXHAUSTED,
        format!("SERVER: Received message larger than max ({length} vs. {max})"),
    )
}

/// A message's 5-byte prefix, once `buf` holds it: (compressed flag, length), the length checked against
/// the limit before the message is read (grpc-core's check of the size on the wire).
fn prefix(buf: &[u8], max: usize) -> Result<Option<(u8, usize)>, Refusal> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let length = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if length > max {
        return Err(too_large(length, max));
    }
    Ok(Some((buf[0], length)))
}

/// The message as the handler gets it: decompressed when its flag says so, at most `max` bytes either way.
async fn decode(flag: u8, message: Bytes, encoding: Encoding, max: usize) -> Result<Bytes, Refusal> {
    match (flag, encoding) {
        (0, _) => Ok(message),
        (1, Encoding::Identity) => Err((INTERNAL, "Compression bit set but no encoding configured".into())),
        (1, _) if message.len() <= INFLATE_INLINE => inflate(&message, encoding, max),
        (1, _) => tokio::task::spawn_blocking(move || inflate(&message, encoding, max))
            .await
            .unwrap_or_else(|e| Err((INTERNAL, format!("decompressing the request failed: {e}")))),
        (flag, _) => Err((INTERNAL, format!("Bad gRPC message flag 0x{flag:02x}"))),
    }
}

fn inflate(message: &[u8], encoding: Encoding, max: usize) -> Result<Bytes, Refusal> {
    let reader: Box<dyn Read + '_> = match encoding {
        Encoding::Gzip => Box::new(GzDecoder::new(message)),
        _ => Box::new(ZlibDecoder::new(message)),
    };
    // one byte past the limit tells "too large" from "exactly the limit" without inflating a bomb further
    let mut out = Vec::with_capacity((message.len() * 4).min(max + 1));
    match reader.take(max as u64 + 1).read_to_end(&mut out) {
        Ok(_) if out.len() > max => Err((RESOURCE_EXHAUSTED, "Decompressed message larger than max".into())),
        Ok(_) => Ok(Bytes::from(out)),
        Err(_) => Err((INTERNAL, "Decompression failed due to zlib error".into())),
    }
}

enum Reply {
    /// the serialized response message, already framed (5-byte prefix)
    Ok(Bytes),
    Err(u32, String),
}

/// What Python writes on a stream: a framed message, or the final status.
enum Out {
    Message(Bytes),
    Status(u32, String),
}

/// How a call is answered: one reply (unary), or messages then a status (streaming).
enum Answer {
    Unary(oneshot::Sender<Reply>),
    Stream {
        out: mpsc::UnboundedSender<Out>,
        /// one permit per request message Python asked for
        permits: Arc<Semaphore>,
        backlog: Arc<Backlog>,
    },
}

/// How many of a stream's messages wait in its channel, and whether Python waits for room.
#[derive(Default)]
struct Backlog {
    queued: AtomicUsize,
    waiting: AtomicBool,
}

struct Call {
    id: u64,
    method: usize,
    /// the request message (None: a stream, whose messages come one by one)
    payload: Option<Bytes>,
    headers: HeaderMap,
    timeout: Option<f64>,
    answer: Answer,
}

struct Shared {
    methods: HashMap<String, usize>,
    /// by method index: bidirectional streaming
    streaming: Vec<bool>,
    /// calls to unknown methods go to Python as method index `streaming.len()` (it checks the bearer token
    /// before answering UNIMPLEMENTED, as grpc.aio's interceptor runs before its method lookup)
    unknown_to_python: bool,
    queue: Mutex<Vec<Call>>,
    /// request messages of streams, by call id (None: the client ended its side)
    messages: Mutex<Vec<(u64, Option<Bytes>)>>,
    /// ids of calls whose client went away (stream reset, deadline) before Python answered
    cancelled: Mutex<Vec<u64>>,
    /// ids of streams whose backlog went below BACKLOG while Python waited for room
    writable: Mutex<Vec<u64>>,
    efd: RawFd,
    max_message: usize,
    /// largest request metadata (HPACK size: name + value + 32 per entry, pseudo-headers too); 0: none
    max_metadata: usize,
    /// each connection gets a graceful GOAWAY after this long (+-10% jitter), as grpc's max_connection_age
    max_connection_age: Option<Duration>,
    accepting: AtomicBool,
    calls: AtomicU64,
    wakeups: AtomicU64,
    /// open connections (a closed one's socket until its lingering close ends): `shutdown` waits for them to
    /// finish their streams after the GOAWAY
    connections: AtomicUsize,
}

impl Shared {
    fn wake(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        let one: u64 = 1;
        // an eventfd write only fails when the counter would overflow: then it is already readable
        unsafe { libc::write(self.efd, &one as *const u64 as *const libc::c_void, 8) };
    }

    fn push(&self, call: Call) {
        let was_empty = {
            let mut q = self.queue.lock().unwrap();
            let empty = q.is_empty();
            q.push(call);
            empty
        };
        if was_empty {
            self.wake();
        }
    }

    fn deliver(&self, id: u64, message: Option<Bytes>) {
        let was_empty = {
            let mut q = self.messages.lock().unwrap();
            let empty = q.is_empty();
            q.push((id, message));
            empty
        };
        if was_empty {
            self.wake();
        }
    }

    fn cancel(&self, id: u64) {
        self.cancelled.lock().unwrap().push(id);
        self.wake();
    }

    fn writable(&self, id: u64) {
        self.writable.lock().unwrap().push(id);
        self.wake();
    }
}

/// Tells Python a call was given up (its tokio task dropped: stream reset, deadline) unless it was answered.
struct Unanswered<'a> {
    id: u64,
    shared: &'a Shared,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.cancel(self.id);
        }
    }
}

/// The response body: a unary call's (at most one DATA frame, then the trailers; none at all for a
/// trailers-only reply), or a stream's.
enum GrpcBody {
    Unary {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    Stream(StreamBody),
}

/// A stream's messages as Python sends them, then its status; DEADLINE_EXCEEDED at the deadline. Dropped
/// before the status (the client reset the stream): Python is told to cancel the call.
struct StreamBody {
    rx: mpsc::UnboundedReceiver<Out>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
    id: u64,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    backlog: Arc<Backlog>,
}

impl StreamBody {
    fn end(&mut self, code: u32, message: &str) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.done = true;
        self.permits.close(); // the request reader stops
        let mut trailers = HeaderMap::with_capacity(2);
        status_headers(&mut trailers, code, message);
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        self.permits.close();
        if !self.done {
            self.shared.cancel(self.id);
        }
    }
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            GrpcBody::Unary { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                if let Some(trailers) = trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Poll::Ready(None)
            }
            GrpcBody::Stream(stream) => {
                if stream.done {
                    return Poll::Ready(None);
                }
                match stream.rx.poll_recv(cx) {
                    Poll::Ready(Some(Out::Message(data))) => {
                        let before = stream.backlog.queued.fetch_sub(1, Ordering::SeqCst);
                        if before <= BACKLOG && stream.backlog.waiting.swap(false, Ordering::SeqCst) {
                            stream.shared.writable(stream.id);
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Poll::Ready(Some(Out::Status(code, message))) => return stream.end(code, &message),
                    Poll::Ready(None) => return stream.end(INTERNAL, "the handler ended without a status"),
                    Poll::Pending => {}
                }
                if let Some(deadline) = stream.deadline.as_mut() {
                    if deadline.as_mut().poll(cx).is_ready() {
                        stream.shared.cancel(stream.id);
                        return stream.end(DEADLINE_EXCEEDED, "Deadline Exceeded");
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GrpcBody::Unary { data, trailers } => data.is_none() && trailers.is_none(),
            GrpcBody::Stream(stream) => stream.done,
        }
    }
}

/// grpc-message is percent-encoded (gRPC's PROTOCOL-HTTP2.md): bytes outside 0x20..=0x7E and '%'.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{:02X}", b));
        }
    }
    out
}

fn status_headers(headers: &mut HeaderMap, code: u32, message: &str) {
    headers.insert("grpc-status", HeaderValue::from(code));
    if !message.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
            headers.insert("grpc-message", v);
        }
    }
}

fn content_type() -> HeaderValue {
    HeaderValue::from_static("application/grpc")
}

fn error_response(code: u32, message: &str) -> Response<GrpcBody> {
    let mut response = Response::new(GrpcBody::Unary {
        data: None,
        trailers: None,
    });
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, content_type());
    status_headers(headers, code, message);
    response
}

fn ok_response(framed: Bytes) -> Response<GrpcBody> {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = Response::new(GrpcBody::Unary {
        data: Some(framed),
        trailers: Some(trailers),
    });
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, content_type());
    headers.insert("grpc-accept-encoding", HeaderValue::from_static(ACCEPT_ENCODING));
    response
}

/// grpc-timeout: up to 8 digits and a unit (H M S m u n).
fn parse_timeout(value: &HeaderValue) -> Option<f64> {
    let s = value.to_str().ok()?;
    if s.len() < 2 {
        return None;
    }
    let (digits, unit) = s.split_at(s.len() - 1);
    let n: f64 = digits.parse::<u64>().ok()? as f64;
    let scale = match unit {
        "H" => 3600.0,
        "M" => 60.0,
        "S" => 1.0,
        "m" => 1e-3,
        "u" => 1e-6,
        "n" => 1e-9,
        _ => return None,
    };
    Some(n * scale)
}

/// grpc-core's hard metadata limit and its message (RESOURCE_EXHAUSTED), so clients see what grpc.aio says.
fn metadata_too_large(request: &Request<Incoming>, limit: usize) -> Option<String> {
    let uri = request.uri();
    let authority = uri.authority().map(|a| a.as_str().len()).unwrap_or(0);
    let scheme = uri.scheme_str().map(|s| s.len()).unwrap_or(4);
    let mut entries: Vec<(&str, usize)> = vec![
        (":path", 5 + uri.path().len() + 32),
        (":authority", 10 + authority + 32),
        (":method", 7 + request.method().as_str().len() + 32),
        (":scheme", 7 + scheme + 32),
    ];
    for (name, value) in request.headers() {
        if value.len() > limit {
            return Some(format!(
                "received metadata size exceeds hard limit (value length {} vs. {})",
                value.len(),
                limit
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

async fn handle(request: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<GrpcBody>, Infallible> {
    if request.method() != http::Method::POST {
        let mut r = error_response(INTERNAL, "gRPC requires POST");
        *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return Ok(r);
    }
    let Some(&method) = shared.methods.get(request.uri().path()) else {
        if shared.unknown_to_python {
            if !shared.accepting.load(Ordering::Relaxed) {
                return Ok(error_response(UNAVAILABLE, "the server is shutting down"));
            }
            // its body is never read: Python only answers (UNAUTHENTICATED or UNIMPLEMENTED)
            let (parts, _) = request.into_parts();
            let timeout = parts.headers.get("grpc-timeout").and_then(parse_timeout);
            let unknown = shared.streaming.len();
            return Ok(dispatch(shared, unknown, Bytes::new(), parts.headers, timeout).await);
        }
        return Ok(error_response(UNIMPLEMENTED, METHOD_NOT_FOUND));
    };
    if shared.max_metadata > 0 {
        if let Some(message) = metadata_too_large(&request, shared.max_metadata) {
            return Ok(error_response(RESOURCE_EXHAUSTED, &message));
        }
    }
    let Some(encoding) = Encoding::of(request.headers()) else {
        if !shared.streaming[method] {
            // read (up to the limit) before answering, so the client is not reset while it is still sending
            let _ = Limited::new(request.into_body(), shared.max_message + 5)
                .collect()
                .await;
        }
        let mut refused = error_response(INTERNAL, "Error parsing 'grpc-encoding' metadata");
        let headers = refused.headers_mut();
        headers.insert("grpc-accept-encoding", HeaderValue::from_static(ACCEPT_ENCODING));
        return Ok(refused);
    };
    if !shared.accepting.load(Ordering::Relaxed) {
        return Ok(error_response(UNAVAILABLE, "the server is shutting down"));
    }
    if shared.streaming[method] {
        return Ok(stream_call(request, shared, method, encoding));
    }
    let (parts, body) = request.into_parts();
    let timeout = parts.headers.get("grpc-timeout").and_then(parse_timeout);
    let payload = match read_unary(body, encoding, shared.max_message).await {
        Ok(payload) => payload,
        Err((code, message)) => return Ok(error_response(code, &message)),
    };
    Ok(dispatch(shared, method, payload, parts.headers, timeout).await)
}

/// A unary call handed to Python: its answer, or DEADLINE_EXCEEDED at the deadline.
async fn dispatch(
    shared: Arc<Shared>,
    method: usize,
    payload: Bytes,
    headers: HeaderMap,
    timeout: Option<f64>,
) -> Response<GrpcBody> {
    let (tx, rx) = oneshot::channel();
    let id = shared.calls.fetch_add(1, Ordering::Relaxed);
    shared.push(Call {
        id,
        method,
        payload: Some(payload),
        headers,
        timeout,
        answer: Answer::Unary(tx),
    });
    let mut guard = Unanswered {
        id,
        shared: &shared,
        answered: false,
    };
    let reply = match timeout {
        Some(t) => match tokio::time::timeout(Duration::from_secs_f64(t), rx).await {
            Ok(r) => r,
            Err(_) => return error_response(DEADLINE_EXCEEDED, "Deadline Exceeded"),
        },
        None => rx.await,
    };
    guard.answered = true;
    match reply {
        Ok(Reply::Ok(framed)) => ok_response(framed),
        Ok(Reply::Err(code, message)) => error_response(code, &message),
        Err(_) => error_response(INTERNAL, "the handler ended without a response"),
    }
}

/// A unary call's one request message, decoded. Its length is checked as soon as its prefix arrives; a
/// body of one DATA frame (the usual case) is not copied.
async fn read_unary(mut body: Incoming, encoding: Encoding, max: usize) -> Result<Bytes, Refusal> {
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut header: Option<(u8, usize)> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| (INTERNAL, format!("reading the request failed: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        if first.is_none() && buf.is_empty() {
            first = Some(data);
        } else {
            if let Some(first) = first.take() {
                buf.extend_from_slice(&first);
            }
            buf.extend_from_slice(&data);
        }
        let received: &[u8] = first.as_deref().unwrap_or(&buf[..]);
        if header.is_none() {
            header = prefix(received, max)?;
        }
        if let Some((_, length)) = header {
            if received.len() > 5 + length {
                return Err((UNIMPLEMENTED, "one request message per unary call".into()));
            }
        }
    }
    let body = first.unwrap_or_else(|| buf.freeze());
    let Some((flag, length)) = header else {
        return Err((INTERNAL, "the request has no gRPC message".into()));
    };
    if body.len() != 5 + length {
        return Err((INTERNAL, "the request ended inside its gRPC message".into()));
    }
    decode(flag, body.slice(5..), encoding, max).await
}

/// A bidirectional stream: handed to Python at once; its request messages are read as Python asks.
fn stream_call(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    method: usize,
    encoding: Encoding,
) -> Response<GrpcBody> {
    let (parts, body) = request.into_parts();
    let timeout = parts.headers.get("grpc-timeout").and_then(parse_timeout);
    let (out, rx) = mpsc::unbounded_channel();
    let permits = Arc::new(Semaphore::new(0));
    let backlog = Arc::new(Backlog::default());
    let id = shared.calls.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(read_messages(
        body,
        encoding,
        id,
        shared.clone(),
        permits.clone(),
        out.clone(),
    ));
    shared.push(Call {
        id,
        method,
        payload: None,
        headers: parts.headers,
        timeout,
        answer: Answer::Stream {
            out,
            permits: permits.clone(),
            backlog: backlog.clone(),
        },
    });
    let mut response = Response::new(GrpcBody::Stream(StreamBody {
        rx,
        deadline: timeout.map(|t| Box::pin(tokio::time::sleep(Duration::from_secs_f64(t)))),
        done: false,
        id,
        shared,
        permits,
        backlog,
    }));
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, content_type());
    headers.insert("grpc-accept-encoding", HeaderValue::from_static(ACCEPT_ENCODING));
    response
}

/// Reads a stream's request messages, one per permit (Python's `want`), and hands each to Python; a
/// message the transport refuses ends the stream with that status.
async fn read_messages(
    mut body: Incoming,
    encoding: Encoding,
    id: u64,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    out: mpsc::UnboundedSender<Out>,
) {
    let fail = |code: u32, message: String| {
        let _ = out.send(Out::Status(code, message));
        shared.cancel(id);
    };
    let mut buf = BytesMut::new();
    loop {
        match permits.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return, // the response has ended
        }
        let message = loop {
            match prefix(&buf, shared.max_message) {
                Err((code, message)) => return fail(code, message),
                Ok(Some((flag, length))) if buf.len() >= 5 + length => {
                    let mut message = buf.split_to(5 + length);
                    message.advance(5);
                    match decode(flag, message.freeze(), encoding, shared.max_message).await {
                        Ok(message) => break Some(message),
                        Err((code, message)) => return fail(code, message),
                    }
                }
                Ok(_) => {}
            }
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
                Some(Err(_)) => return, // reset: the response body is dropped too, which cancels the call
                None if buf.is_empty() => break None,
                None => return fail(INTERNAL, "the request stream ended inside a message".into()),
            }
        };
        let end = message.is_none();
        shared.deliver(id, message);
        if end {
            return;
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stop = stop.clone();
        let opened = shared.connections.fetch_add(1, Ordering::SeqCst) as u64;
        let age = shared.max_connection_age.map(|age| jitter(age, opened));
        let socket = Socket {
            stream: Some(stream),
            open: Some(Open(shared.clone())),
        };
        tokio::spawn(async move {
            // hyper's own header limit (16 KiB) stays above ours, so that our check answers with a gRPC status
            let header_list = (shared.max_metadata.saturating_mul(4)).clamp(64 * 1024, u32::MAX as usize) as u32;
            let service = service_fn(move |req| handle(req, shared.clone()));
            let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            builder
                .timer(TokioTimer::new())
                .max_concurrent_streams(1024)
                .max_header_list_size(header_list);
            let conn = builder.serve_connection(TokioIo::new(socket), service);
            tokio::pin!(conn);
            let aged = async {
                match age {
                    Some(age) => tokio::time::sleep(age).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stop.changed() => {}
                _ = aged => {}
            }
            // graceful: GOAWAY, the streams already open finish (no grace limit, as grpc's default)
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
}

/// How long a finished connection's socket is drained before it is closed (`Socket`).
const LINGER: Duration = Duration::from_secs(1);

/// A connection's socket, closed with a lingering close when hyper is done with it.
///
/// After the last GOAWAY the client may still be sending: calls it opened before it read the GOAWAY (the
/// server ignores them, the client retries them on a new connection), pings, window updates. Closing a socket
/// with unread data makes the kernel answer with a TCP RST instead of the FIN, and the RST throws away what
/// the client has not read yet: the last responses and the GOAWAY itself, so those calls fail UNAVAILABLE
/// ("Connection reset by peer"). So, as nginx's lingering close and Go's closeWriteAndWait do, the socket's
/// write side is shut (FIN, normally sent by h2 already) and what still comes is read and dropped until the
/// client closes its side, for at most `LINGER`; the connection counts as open until then.
struct Socket {
    stream: Option<tokio::net::TcpStream>,
    open: Option<Open>,
}

impl Socket {
    fn stream(&mut self) -> Pin<&mut tokio::net::TcpStream> {
        Pin::new(self.stream.as_mut().expect("the socket is open until dropped"))
    }
}

impl tokio::io::AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.get_mut().stream().poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.get_mut().stream().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().stream().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().stream().poll_shutdown(cx)
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let (Some(stream), Some(open)) = (self.stream.take(), self.open.take()) else {
            return;
        };
        // a runtime that is shutting down drops the task at once: the socket is closed then
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(stream, open));
        }
    }
}

async fn linger(mut stream: tokio::net::TcpStream, _open: Open) {
    use tokio::io::AsyncWrite;
    let _ = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await;
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        loop {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut scratch) {
                Ok(0) => return, // the client closed its side
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    })
    .await;
}

/// A message with gRPC's 5-byte prefix (uncompressed, big-endian length).
fn frame(message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(message);
    framed.freeze()
}

/// `age` +-10%, so that connections opened together are not all sent away at once (grpc's jitter).
fn jitter(age: Duration, seed: u64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    // splitmix64 of the seed and the clock: cheap, and good enough to spread reconnections
    let mut x = seed.wrapping_add(nanos).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let factor = 0.9 + 0.2 * (x % 10_001) as f64 / 10_000.0;
    age.mul_f64(factor)
}

/// Counts a connection as open until its socket is closed (however its task ends).
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One call waiting for Python's answer.
#[pyclass(frozen, module = "kubeinfer_grpc_transport")]
struct PendingCall {
    /// a unary call's answer
    tx: Mutex<Option<oneshot::Sender<Reply>>>,
    /// a stream's messages and status
    out: Mutex<Option<mpsc::UnboundedSender<Out>>>,
    permits: Option<Arc<Semaphore>>,
    backlog: Option<Arc<Backlog>>,
    headers: HeaderMap,
    #[pyo3(get)]
    timeout: Option<f64>,
    /// --grpc-max-message-bytes: a larger response fails the call (RESOURCE_EXHAUSTED) instead
    max_message: usize,
}

#[pymethods]
impl PendingCall {
    /// Answer a unary call with a serialized response message (one over the limit: RESOURCE_EXHAUSTED
    /// instead). False if the call is already gone (cancelled, timed out).
    fn reply(&self, message: &[u8]) -> bool {
        let Some(tx) = self.tx.lock().unwrap().take() else {
            return false;
        };
        if message.len() > self.max_message {
            return tx
                .send(Reply::Err(
                    RESOURCE_EXHAUSTED,
                    sent_too_large(message.len(), self.max_message),
                ))
                .is_ok();
        }
        tx.send(Reply::Ok(frame(message))).is_ok()
    }

    /// Write one serialized message on a stream. False if the stream is gone or finished — or if the
    /// message is over the limit: then the stream ends with RESOURCE_EXHAUSTED, as grpc ends it.
    fn send(&self, message: &[u8]) -> bool {
        let mut out = self.out.lock().unwrap();
        if message.len() > self.max_message {
            if let Some(out) = out.take() {
                let _ = out.send(Out::Status(
                    RESOURCE_EXHAUSTED,
                    sent_too_large(message.len(), self.max_message),
                ));
            }
            return false;
        }
        let (Some(out), Some(backlog)) = (out.as_ref(), &self.backlog) else {
            return false;
        };
        backlog.queued.fetch_add(1, Ordering::SeqCst);
        out.send(Out::Message(frame(message))).is_ok()
    }

    /// True when BACKLOG of this stream's messages wait for the client: send no more until the stream's
    /// id comes out of `take` as writable (or the call is cancelled).
    fn full(&self) -> bool {
        let Some(backlog) = &self.backlog else {
            return false;
        };
        if backlog.queued.load(Ordering::SeqCst) < BACKLOG {
            return false;
        }
        backlog.waiting.store(true, Ordering::SeqCst);
        // read again after announcing the wait: a message taken in between did not see it (a notice for a
        // wait that did not happen is harmless)
        backlog.queued.load(Ordering::SeqCst) >= BACKLOG
    }

    /// End a stream with status OK.
    fn finish(&self) -> bool {
        self.abort(0, "")
    }

    /// Answer with a gRPC status (code as an int) and its message; a stream ends with it.
    fn abort(&self, code: u32, message: &str) -> bool {
        if let Some(tx) = self.tx.lock().unwrap().take() {
            return tx.send(Reply::Err(code, message.to_owned())).is_ok();
        }
        if let Some(out) = self.out.lock().unwrap().take() {
            return out.send(Out::Status(code, message.to_owned())).is_ok();
        }
        false
    }

    /// Let the transport read one more request message of this stream (it comes out of `take`).
    fn want(&self) {
        if let Some(permits) = &self.permits {
            permits.add_permits(1);
        }
    }

    /// True when nobody waits for the answer any more (client reset the stream, deadline passed).
    fn cancelled(&self) -> bool {
        if let Some(tx) = self.tx.lock().unwrap().as_ref() {
            return tx.is_closed();
        }
        match self.out.lock().unwrap().as_ref() {
            Some(out) => out.is_closed(),
            None => true,
        }
    }

    /// One metadata value (the first, as text), or None.
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// The request's metadata as (key, value) pairs, gRPC's reserved and HTTP/2 headers left out.
    fn metadata(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .filter(|(k, _)| {
                let k = k.as_str();
                !(k.starts_with("grpc-") || k == "te" || k == "content-type" || k == "user-agent")
            })
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect()
    }
}

/// The listener and its runtime; `fd` becomes readable when calls are queued.
#[pyclass(frozen, module = "kubeinfer_grpc_transport")]
struct Transport {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    #[pyo3(get)]
    port: u16,
    #[pyo3(get)]
    fd: RawFd,
}

#[pymethods]
impl Transport {
    /// `methods`: the unary methods' paths, then `streams`: the bidirectional streaming ones'; a call's
    /// method index counts through both. `unknown_to_python`: a call to any other path comes out of `take`
    /// as a unary call with the index one past the last (no payload read), for Python to answer; else the
    /// transport answers it UNIMPLEMENTED.
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (
        host, port, methods, streams=Vec::new(), threads=1, max_message_bytes=64 * 1024 * 1024, max_metadata_bytes=0,
        max_connection_age_ms=0, unknown_to_python=false
    ))]
    fn new(
        host: &str,
        port: u16,
        methods: Vec<String>,
        streams: Vec<String>,
        threads: usize,
        max_message_bytes: usize,
        max_metadata_bytes: usize,
        max_connection_age_ms: u64,
        unknown_to_python: bool,
    ) -> PyResult<Self> {
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(PyOSError::new_err("eventfd failed"));
        }
        let streaming: Vec<bool> = methods
            .iter()
            .map(|_| false)
            .chain(streams.iter().map(|_| true))
            .collect();
        let shared = Arc::new(Shared {
            methods: methods
                .into_iter()
                .chain(streams)
                .enumerate()
                .map(|(i, m)| (m, i))
                .collect(),
            streaming,
            unknown_to_python,
            queue: Mutex::new(Vec::with_capacity(64)),
            messages: Mutex::new(Vec::new()),
            cancelled: Mutex::new(Vec::new()),
            writable: Mutex::new(Vec::new()),
            efd,
            max_message: max_message_bytes,
            max_metadata: max_metadata_bytes,
            max_connection_age: (max_connection_age_ms > 0).then(|| Duration::from_millis(max_connection_age_ms)),
            accepting: AtomicBool::new(true),
            calls: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
        });
        // an IP address, or a name resolved as grpc resolves it (the first address)
        let shown = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let addr: SocketAddr = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| PyOSError::new_err(format!("gRPC listener on {shown} failed to start: unknown address")))?;
        let std_listener = std::net::TcpListener::bind(addr)
            .map_err(|e| PyOSError::new_err(format!("gRPC listener on {addr} failed to start: {e}")))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let bound = std_listener
            .local_addr()
            .map_err(|e| PyOSError::new_err(e.to_string()))?
            .port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("grpc-transport")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let (stop, stop_rx) = watch::channel(false);
        {
            let shared = shared.clone();
            let _guard = runtime.enter();
            let listener =
                tokio::net::TcpListener::from_std(std_listener).map_err(|e| PyOSError::new_err(e.to_string()))?;
            runtime.spawn(serve(listener, shared, stop_rx));
        }
        Ok(Transport {
            shared,
            stop,
            runtime: Mutex::new(Some(runtime)),
            port: bound,
            fd: efd,
        })
    }

    /// `(calls, cancelled, messages, writable)`: every queued call as `(call, method_index, payload, call_id)`
    /// (payload None for a stream), the ids of calls given up by their client (stream reset, deadline),
    /// streams' request messages as `(call_id, payload)` (None: the client ended its side), and the ids of
    /// streams with room again after `full()` said True — one GIL
    /// acquisition for all of them. The eventfd is read first, then the cancellations, the calls and the
    /// messages: a call always comes out no later than its cancellation (a stream's messages come only
    /// after Python asked, so after its call), and anything queued after the read writes the eventfd again.
    #[allow(clippy::type_complexity)]
    fn take<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyList>,
        Bound<'py, PyAny>,
        Bound<'py, PyList>,
        Bound<'py, PyAny>,
    )> {
        let mut counter: u64 = 0;
        unsafe { libc::read(self.shared.efd, &mut counter as *mut u64 as *mut libc::c_void, 8) };
        let ids = |list: &Mutex<Vec<u64>>| -> PyResult<Bound<'py, PyAny>> {
            let mut c = list.lock().unwrap();
            Ok(if c.is_empty() {
                PyTuple::empty(py).into_any()
            } else {
                std::mem::take(&mut *c).into_pyobject(py)?.into_any()
            })
        };
        let cancelled = ids(&self.shared.cancelled)?;
        let writable = ids(&self.shared.writable)?;
        let calls = std::mem::take(&mut *self.shared.queue.lock().unwrap());
        let list = PyList::empty(py);
        for call in calls {
            let (tx, out, permits, backlog) = match call.answer {
                Answer::Unary(tx) => (Some(tx), None, None, None),
                Answer::Stream { out, permits, backlog } => (None, Some(out), Some(permits), Some(backlog)),
            };
            let pending = Bound::new(
                py,
                PendingCall {
                    tx: Mutex::new(tx),
                    out: Mutex::new(out),
                    permits,
                    backlog,
                    headers: call.headers,
                    timeout: call.timeout,
                    max_message: self.shared.max_message,
                },
            )?;
            let payload = call.payload.map(|p| PyBytes::new(py, &p));
            let item: Bound<'py, PyTuple> = (pending, call.method, payload, call.id).into_pyobject(py)?;
            list.append(item)?;
        }
        let messages = std::mem::take(&mut *self.shared.messages.lock().unwrap());
        let delivered = PyList::empty(py);
        for (id, message) in messages {
            let item: Bound<'py, PyTuple> = (id, message.map(|m| PyBytes::new(py, &m))).into_pyobject(py)?;
            delivered.append(item)?;
        }
        Ok((list, cancelled, delivered, writable))
    }

    /// (calls handed to Python, event-loop wake-ups) since start.
    fn stats(&self) -> (u64, u64) {
        (
            self.shared.calls.load(Ordering::Relaxed),
            self.shared.wakeups.load(Ordering::Relaxed),
        )
    }

    /// New calls answer UNAVAILABLE; connections get a GOAWAY (open streams finish); the listener closes.
    fn close(&self) {
        self.shared.accepting.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
    }

    /// Stop the runtime (after `close` and the grace the caller chose): the connections get up to `timeout`
    /// seconds to write the answers already given and end (GOAWAY sent), then whatever is left is dropped.
    fn shutdown(&self, py: Python<'_>, timeout: f64) {
        self.close();
        let runtime = self.runtime.lock().unwrap().take();
        if let Some(rt) = runtime {
            let shared = self.shared.clone();
            py.detach(|| {
                rt.block_on(async {
                    let _ = tokio::time::timeout(Duration::from_secs_f64(timeout), async {
                        while shared.connections.load(Ordering::SeqCst) > 0 {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    })
                    .await;
                });
                rt.shutdown_timeout(Duration::from_millis(100))
            });
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        // the runtime's tasks write the eventfd: stop them before it is closed
        if let Some(rt) = self.runtime.lock().unwrap().take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        unsafe { libc::close(self.shared.efd) };
    }
}

#[pymodule]
fn kubeinfer_grpc_transport(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Transport>()?;
    m.add_class::<PendingCall>()?;
    Ok(())
}
