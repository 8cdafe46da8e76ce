//! The HTTP/1.1 transport: hyper's HTTP/1 server on a tokio runtime, each request handed to Python's event
//! loop through the same batched hand-off as gRPC calls (`handoff::push_waking`: a queue and an eventfd written
//! only when the queue goes from empty to non-empty; Python drains it in one GIL acquisition).
//!
//! hyper enforces what a server facing any client needs, as settings: the head's size (431) and the time it
//! may take to arrive (the connection closes), and HTTP/1.1's framing. This module adds what hyper leaves to
//! its user, with the pure-Python transport's statuses and texts (`server/http/protocol.py`): the body's size
//! (413 from Content-Length alone, before a byte of it is read; a chunked body is counted as it comes), the
//! time the body may take (408), the cap on open connections (503 with `Connection: close`), and the idle
//! time of a kept-alive connection (closed). A request whose connection goes away before Python answered is
//! reported to Python as cancelled (hyper drops its future: `Unanswered`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Either, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

use crate::handoff::{lock, push_waking, EventFd};

/// The limits every connection and request is held to (None / 0: no limit).
pub struct Limits {
    /// a request's head must arrive within this long (hyper's header_read_timeout: then the connection closes)
    pub header_timeout: Option<Duration>,
    /// its body within this long once the head has (408, the connection closes)
    pub body_timeout: Option<Duration>,
    /// a kept-alive connection with no request for this long is closed
    pub idle_timeout: Option<Duration>,
    /// request line plus headers, bytes (431)
    pub max_header: usize,
    /// request body, bytes (413)
    pub max_body: usize,
    /// open connections past which requests are answered 503 and their connection closed (0: none)
    pub max_connections: usize,
}

/// Python's answer: a status and headers, then the whole body or chunks pushed until the sender is dropped.
pub enum Answer {
    Full(StatusCode, HeaderMap, Bytes),
    Stream(StatusCode, HeaderMap, mpsc::UnboundedReceiver<Bytes>),
}

/// One request for Python.
pub struct HttpCall {
    pub id: u64,
    pub method: Method,
    /// path and query, as sent
    pub target: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub peer: SocketAddr,
    pub answer: oneshot::Sender<Answer>,
}

pub struct HttpShared {
    pub queue: Mutex<Vec<HttpCall>>,
    /// ids of requests whose connection went away before Python answered
    pub cancelled: Mutex<Vec<u64>>,
    pub efd: EventFd,
    pub limits: Limits,
    pub accepting: AtomicBool,
    /// open connections: the cap's count, and what `shutdown` waits for
    pub connections: AtomicUsize,
    pub next_id: AtomicU64,
    pub calls: AtomicU64,
    pub wakeups: AtomicU64,
}

impl HttpShared {
    pub fn new(efd: EventFd, limits: Limits) -> Self {
        HttpShared {
            queue: Mutex::new(Vec::with_capacity(64)),
            cancelled: Mutex::new(Vec::new()),
            efd,
            limits,
            accepting: AtomicBool::new(true),
            connections: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            calls: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
        }
    }

    fn push(&self, call: HttpCall) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if push_waking(&self.queue, call, &self.efd) {
            self.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn cancel(&self, id: u64) {
        if push_waking(&self.cancelled, id, &self.efd) {
            self.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Everything queued since the last call: (requests, cancelled ids). The eventfd is read first, then the
    /// cancellations, then the requests: a request comes out no later than its cancellation.
    pub fn take(&self) -> (Vec<HttpCall>, Vec<u64>) {
        self.efd.drain();
        let cancelled = std::mem::take(&mut *lock(&self.cancelled));
        let calls = std::mem::take(&mut *lock(&self.queue));
        (calls, cancelled)
    }
}

/// Tells Python a request was given up (hyper dropped its future: the client went away) unless answered.
struct Unanswered {
    id: u64,
    shared: Arc<HttpShared>,
    answered: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.cancel(self.id);
        }
    }
}

type Body = Either<Full<Bytes>, BoxBody<Bytes, Infallible>>;

/// One connection's state: requests in flight, when the last one ended (the idle timeout's clock), and the
/// request head being received (the head timeout's clock and the head size count).
struct Activity {
    busy: AtomicUsize,
    since: Mutex<Instant>,
    head: Mutex<Head>,
}

/// The head of the next request as it arrives: counted by `Watched` from its first byte to the blank line
/// that ends it (hyper parses the same bytes; this count is what `--max-header-bytes` bounds).
#[derive(Default)]
struct Head {
    /// its first byte came then (the connection's opening, for the first request); None: idle
    started: Option<Instant>,
    bytes: usize,
    /// how much of "\r\n\r\n" the last bytes matched
    matched: u8,
    complete: bool,
    /// over the limit: the connection gets a 431 and closes
    over: bool,
}

/// Counts a request in flight on its connection until dropped; the next head's count starts afresh.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.busy.fetch_add(1, Ordering::SeqCst);
        *lock(&activity.head) = Head::default();
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *lock(&self.0.since) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The socket as hyper reads it: the bytes of a request head are counted (when no request is in flight)
/// until the blank line that ends it; past the limit, hyper is told the connection ended, and the connection
/// task answers 431 itself (hyper's own 431 has no body to say which flag raises the limit).
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
    max_header: usize,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if this.activity.busy.load(Ordering::SeqCst) == 0 {
                let mut head = lock(&this.activity.head);
                if !head.complete && !head.over {
                    head.started.get_or_insert_with(Instant::now);
                    for &byte in &buf.filled()[before..] {
                        head.bytes += 1;
                        head.matched = match (head.matched, byte) {
                            (0 | 2, b'\r') => head.matched + 1,
                            (1 | 3, b'\n') => head.matched + 1,
                            (_, b'\r') => 1,
                            _ => 0,
                        };
                        if head.matched == 4 {
                            head.complete = true;
                            break;
                        }
                        if head.bytes > this.max_header {
                            head.over = true;
                            buf.set_filled(before); // hyper sees the end of the stream, and stops
                            break;
                        }
                    }
                }
            }
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if lock(&self.activity.head).over {
            return Poll::Ready(Ok(())); // the 431 is still to be written
        }
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// How long an answer written outside hyper (408 for a head, 431) drains the client's late bytes before the
/// socket closes, so that they do not turn the FIN into an RST that destroys the answer (server.rs's LINGER).
const LINGER: Duration = Duration::from_secs(1);

/// Writes `answer` on the connection's socket (through a duplicate of its descriptor: hyper owns the
/// stream), ends the write side and reads what the client still sends for up to LINGER.
async fn answer_and_close(fd: RawFd, answer: Vec<u8>) {
    // SAFETY: `fd` is the connection's socket, open while hyper's connection (not polled any more) lives; the
    // duplicate is ours and closed when `stream` drops
    let copy = unsafe { libc::dup(fd) };
    if copy < 0 {
        return;
    }
    // SAFETY: `copy` is a socket descriptor owned by nothing else
    let std_stream = unsafe { std::net::TcpStream::from_raw_fd(copy) };
    let Ok(mut stream) = TcpStream::from_std(std_stream) else {
        return;
    };
    let _ = tokio::time::timeout(LINGER, stream.write_all(&answer)).await;
    let _ = stream.shutdown().await;
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = stream.read(&mut scratch).await {
            if n == 0 {
                return;
            }
        }
    })
    .await;
}

/// Returns once the transport is told to stop (the watch's guard is not held past it).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// An HTTP/1.1 answer with a JSON error body that closes the connection (before any request reached Python).
fn raw_error(status: StatusCode, message: &str) -> Vec<u8> {
    let body = format!("{{\"error\":\"{message}\"}}");
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}

fn seconds(duration: Duration) -> String {
    // as Python's `{:g}` writes the flag's value: 1 s, 0.5 s
    format!("{}", duration.as_secs_f64())
}

/// Counts a connection as open until dropped.
struct Open(Arc<HttpShared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

fn error(status: StatusCode, message: &str, close: bool) -> Response<Body> {
    // the v2 error shape (codec.error_body); the message is ours, plain ASCII without quotes to escape
    let body = Bytes::from(format!("{{\"error\":\"{message}\"}}"));
    let mut response = Response::new(Either::Left(Full::new(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if close {
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Triton's wording (vocabulary/limits.body_too_large), so clients that match on it keep working.
fn too_large(size: &str, limit: usize) -> Response<Body> {
    let message = format!(
        "Request size of {size} bytes exceeds the maximum allowed value of {limit} bytes. \
         Use --http-max-input-size to increase the limit."
    );
    error(StatusCode::PAYLOAD_TOO_LARGE, &message, true)
}

async fn handle(
    shared: Arc<HttpShared>,
    activity: Arc<Activity>,
    over_cap: bool,
    peer: SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let _busy = Busy::new(&activity);
    let limits = &shared.limits;
    if over_cap {
        let message = format!(
            "the server has more than {} HTTP connections open (--http-max-connections): try again later",
            limits.max_connections
        );
        let mut refused = error(StatusCode::SERVICE_UNAVAILABLE, &message, true);
        refused
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Ok(refused);
    }
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(length) = declared {
        if length > limits.max_body as u64 {
            return Ok(too_large(&length.to_string(), limits.max_body));
        }
    }
    let collect = Limited::new(body, limits.max_body).collect();
    let collected = match limits.body_timeout {
        Some(limit) => match tokio::time::timeout(limit, collect).await {
            Ok(collected) => collected,
            Err(_) => {
                let message = format!(
                    "the request body did not arrive within {} s (--http-body-timeout)",
                    seconds(limit)
                );
                return Ok(error(StatusCode::REQUEST_TIMEOUT, &message, true));
            }
        },
        None => collect.await,
    };
    let body = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Ok(too_large(&format!("more than {}", limits.max_body), limits.max_body));
        }
        // the client went away or broke the framing mid-body: nobody reads an answer
        Err(_) => {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
                true,
            ))
        }
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    shared.push(HttpCall {
        id,
        method: parts.method,
        target,
        headers: parts.headers,
        body,
        peer,
        answer: tx,
    });
    let mut unanswered = Unanswered {
        id,
        shared: shared.clone(),
        answered: false,
    };
    let answer = rx.await;
    unanswered.answered = true;
    let (status, headers, body) = match answer {
        Ok(Answer::Full(status, headers, body)) => (status, headers, Either::Left(Full::new(body))),
        Ok(Answer::Stream(status, headers, chunks)) => {
            let frames = UnboundedReceiverStream::new(chunks).map(|chunk| Ok::<_, Infallible>(Frame::data(chunk)));
            (status, headers, Either::Right(BodyExt::boxed(StreamBody::new(frames))))
        }
        // Python dropped the request without an answer (the transport is closing)
        Err(_) => {
            return Ok(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
                true,
            ))
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok(response)
}

/// Serves until `stop` says so: then the listener closes and every connection finishes its request in flight
/// and closes (`HttpTransport.shutdown` bounds that wait).
pub async fn serve(listener: TcpListener, shared: Arc<HttpShared>, mut stop: watch::Receiver<bool>) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    // the head's size and time are counted by `Watched` and the connection task (hyper's header_read_timeout
    // would also time a kept-alive connection's idle wait, and its 431 has no body); hyper's own limit on the
    // head stays above ours, as a backstop
    builder
        .timer(TokioTimer::new())
        .keep_alive(true)
        .half_close(false)
        .header_read_timeout(None)
        .max_header_size(shared.limits.max_header.saturating_mul(2).max(8192))
        .max_buf_size(shared.limits.max_header.saturating_mul(2).max(8192) + 8192);
    let builder = Arc::new(builder);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let Ok((stream, peer)) = accepted else {
            // out of file descriptors and the like: try again shortly rather than spin
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let open = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let cap = shared.limits.max_connections;
        let over_cap = cap > 0 && open > cap;
        tokio::spawn(connection(
            builder.clone(),
            stream,
            peer,
            Open(shared.clone()),
            shared.clone(),
            over_cap,
            stop.clone(),
        ));
    }
}

async fn connection(
    builder: Arc<hyper::server::conn::http1::Builder>,
    stream: TcpStream,
    peer: SocketAddr,
    _open: Open,
    shared: Arc<HttpShared>,
    over_cap: bool,
    mut stop: watch::Receiver<bool>,
) {
    let limits = &shared.limits;
    let (idle, head_timeout, max_header) = (limits.idle_timeout, limits.header_timeout, limits.max_header);
    let activity = Arc::new(Activity {
        busy: AtomicUsize::new(0),
        since: Mutex::new(Instant::now()),
        head: Mutex::new(Head {
            started: Some(Instant::now()), // a connection that never sends a head is timed too
            ..Head::default()
        }),
    });
    let fd = stream.as_raw_fd();
    let io = Watched {
        stream,
        activity: activity.clone(),
        max_header,
    };
    let served = activity.clone();
    let service = service_fn(move |request| handle(shared.clone(), served.clone(), over_cap, peer, request));
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        // the head's clock while a head is awaited or arriving; else the idle clock (restarted when a request
        // ends); neither while a request is in flight
        let (deadline, timing_head) = {
            let head = lock(&activity.head);
            let busy = activity.busy.load(Ordering::SeqCst) > 0;
            match (busy, head.started, head_timeout) {
                (false, Some(started), Some(limit)) if !head.complete => (Some(started + limit), true),
                (false, None, _) => (idle.map(|idle| *lock(&activity.since) + idle), false),
                _ => (None, false),
            }
        };
        let deadline = deadline.map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = conn.as_mut() => {
                if lock(&activity.head).over {
                    let message = format!(
                        "the request line and headers exceed {max_header} bytes; send smaller headers or raise \
                         --max-header-bytes"
                    );
                    answer_and_close(fd, raw_error(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, &message)).await;
                }
                return;
            }
            _ = stopped(&mut stop), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                if deadline.is_some_and(|d| tokio::time::Instant::now() < d) {
                    continue; // the clock moved on meanwhile (a request came and went)
                }
                if timing_head {
                    let still = {
                        let head = lock(&activity.head);
                        activity.busy.load(Ordering::SeqCst) == 0 && !head.complete && head.started.is_some()
                    };
                    if still {
                        let limit = head_timeout.unwrap_or_default();
                        let message = format!(
                            "the request head did not arrive within {} s (--http-header-timeout)",
                            seconds(limit)
                        );
                        answer_and_close(fd, raw_error(StatusCode::REQUEST_TIMEOUT, &message)).await;
                        return;
                    }
                } else if activity.busy.load(Ordering::SeqCst) == 0 && lock(&activity.head).started.is_none() {
                    if !closing {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    } else {
                        return; // idle again after a graceful shutdown that did not end it
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on a free port, and a stand-in for Python that answers each request with its method, target
    /// and body (or, for /stream, three chunks) and records the cancelled ids.
    async fn start(limits: Limits) -> (u16, Arc<Mutex<Vec<u64>>>, watch::Sender<bool>) {
        let shared = Arc::new(HttpShared::new(EventFd::new().expect("eventfd"), limits));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(serve(listener, shared.clone(), stop_rx));
        let cancelled = Arc::new(Mutex::new(Vec::new()));
        let seen = cancelled.clone();
        tokio::spawn(async move {
            let mut held = Vec::new(); // /hang requests: never answered
            loop {
                let (calls, ids) = shared.take();
                lock(&seen).extend(ids);
                for call in calls {
                    let text = format!(
                        "{} {} {}",
                        call.method,
                        call.target,
                        String::from_utf8_lossy(&call.body)
                    );
                    if call.target == "/hang" {
                        held.push(call.answer);
                    } else if call.target == "/stream" {
                        let (tx, rx) = mpsc::unbounded_channel();
                        let _ = call.answer.send(Answer::Stream(StatusCode::OK, HeaderMap::new(), rx));
                        for chunk in ["data: 1\n\n", "data: 2\n\n", "data: 3\n\n"] {
                            let _ = tx.send(Bytes::from(chunk));
                        }
                    } else {
                        let _ = call
                            .answer
                            .send(Answer::Full(StatusCode::OK, HeaderMap::new(), Bytes::from(text)));
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        (port, cancelled, stop)
    }

    fn limits() -> Limits {
        Limits {
            header_timeout: Some(Duration::from_millis(300)),
            body_timeout: Some(Duration::from_millis(300)),
            idle_timeout: Some(Duration::from_millis(600)),
            max_header: 1024,
            max_body: 100,
            max_connections: 0,
        }
    }

    /// Everything the server sends until it closes the connection (or 5 s pass).
    async fn exchange(port: u16, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        let _ = stream.write_all(request).await;
        read_to_close(&mut stream).await
    }

    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn requests_are_handed_over_and_answered_on_a_kept_alive_connection() {
        let (port, _, _stop) = start(limits()).await;
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        for body in ["one", "two"] {
            let request = format!(
                "POST /v2/x?q=1 HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("answered")
                .expect("read");
            let answer = String::from_utf8_lossy(&buf[..n]);
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
            assert!(answer.ends_with(&format!("POST /v2/x?q=1 {body}")), "{answer}");
        }
    }

    #[tokio::test]
    async fn a_declared_body_over_the_limit_is_refused_before_it_is_sent() {
        let (port, _, _stop) = start(limits()).await;
        let answer = exchange(port, b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 101\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("Request size of 101 bytes exceeds the maximum allowed value of 100 bytes"));
        assert!(answer.contains("connection: close"), "{answer}");
    }

    #[tokio::test]
    async fn a_chunked_body_over_the_limit_is_refused() {
        let (port, _, _stop) = start(limits()).await;
        let chunk = "a".repeat(150);
        let request =
            format!("POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n96\r\n{chunk}\r\n0\r\n\r\n");
        let answer = exchange(port, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }

    #[tokio::test]
    async fn a_head_over_the_limit_gets_431_naming_the_flag() {
        let (port, _, _stop) = start(limits()).await;
        let request = format!("GET /x HTTP/1.1\r\nhost: t\r\nx-big: {}\r\n\r\n", "a".repeat(2000));
        let answer = exchange(port, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        assert!(answer.contains("--max-header-bytes"), "{answer}");
        // under the limit: served
        let request = format!(
            "GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\nx-big: {}\r\n\r\n",
            "a".repeat(900)
        );
        assert!(exchange(port, request.as_bytes()).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn a_head_that_does_not_arrive_in_time_gets_408_and_the_connection_closes() {
        let (port, _, _stop) = start(limits()).await;
        let started = Instant::now();
        let answer = exchange(port, b"GET /x HTTP/1.1\r\nhost: t\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("the request head did not arrive within 0.3 s (--http-header-timeout)"));
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_gets_408() {
        let (port, _, _stop) = start(limits()).await;
        let answer = exchange(port, b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\nabc").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("--http-body-timeout"), "{answer}");
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed_after_the_idle_time_not_the_head_time() {
        let (port, _, _stop) = start(limits()).await;
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        stream
            .write_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .expect("write");
        let started = Instant::now();
        let answer = read_to_close(&mut stream).await; // the answer, then the close once idle
        let waited = started.elapsed();
        assert!(
            answer.starts_with("HTTP/1.1 200") && !answer.contains("408"),
            "{answer}"
        );
        assert!(
            waited >= Duration::from_millis(500) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn past_the_connection_cap_requests_get_503() {
        let (port, _, _stop) = start(Limits {
            max_connections: 1,
            ..limits()
        })
        .await;
        let _first = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let answer = exchange(port, b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("--http-max-connections") && answer.contains("connection: close"));
    }

    #[tokio::test]
    async fn a_client_that_goes_away_cancels_its_request() {
        let (port, cancelled, _stop) = start(limits()).await;
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        stream
            .write_all(b"GET /hang HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(stream);
        let deadline = Instant::now() + Duration::from_secs(3);
        while lock(&cancelled).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(lock(&cancelled).len(), 1);
    }

    #[tokio::test]
    async fn a_streamed_answer_is_written_chunked_until_it_ends() {
        let (port, _, _stop) = start(limits()).await;
        let answer = exchange(port, b"GET /stream HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await;
        assert!(answer.contains("transfer-encoding: chunked"), "{answer}");
        assert!(
            answer.contains("data: 1\n\n") && answer.contains("data: 3\n\n"),
            "{answer}"
        );
    }
}
