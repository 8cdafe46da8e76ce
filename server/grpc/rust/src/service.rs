//! The one service behind tonic's server: every call, whatever its path, is checked on its headers (method,
//! metadata size, `grpc-timeout`, `grpc-encoding`, the token) before its message is read, then framed and
//! decoded by tonic (`tonic::server::Grpc` with a raw-bytes codec: compression, size limits, statuses) and
//! handed to Python as bytes.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tokio_stream::Stream;
use tonic::body::Body;
use tonic::codec::{CompressionEncoding, Streaming};
use tonic::server::{Grpc, StreamingService, UnaryService};
use tonic::{Code, Status};

use crate::grpc::{self, BytesCodec};
use crate::handoff::{Answer, Backlog, Call, Out, Reply, Shared, Unanswered, BACKLOG};

type Response = http::Response<Body>;

#[derive(Clone)]
pub struct Catchall {
    pub shared: Arc<Shared>,
}

impl tower_service::Service<http::Request<Body>> for Catchall {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // the deadline counts from here, before tonic's own timer for the same grpc-timeout (created after this
        // call returns), so the call ends with grpc-core's DEADLINE_EXCEEDED, not tonic's CANCELLED
        let started = Instant::now();
        let shared = self.shared.clone();
        Box::pin(async move { Ok(handle(shared, request, started).await) })
    }
}

fn refusal(code: Code, message: &str) -> Response {
    Status::new(code, message).into_http()
}

async fn handle(shared: Arc<Shared>, request: http::Request<Body>, started: Instant) -> Response {
    if request.method() != http::Method::POST {
        let mut refused = refusal(Code::Internal, "gRPC requires POST");
        *refused.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return refused;
    }
    let method = shared.methods.get(request.uri().path()).copied();
    if method.is_none() && !shared.token {
        return refusal(Code::Unimplemented, grpc::METHOD_NOT_FOUND);
    }
    let headers = request.headers();
    if shared.max_metadata > 0 {
        if let Some(message) = grpc::metadata_too_large(request.method(), request.uri(), headers, shared.max_metadata) {
            return refusal(Code::ResourceExhausted, &message);
        }
    }
    let Ok(timeout) = grpc::parse_timeout(headers.get(grpc::GRPC_TIMEOUT)) else {
        return refusal(Code::Internal, grpc::BAD_TIMEOUT);
    };
    // a deadline past tokio's clock is none
    let deadline = timeout.and_then(|t| started.checked_add(t));
    if !grpc::encoding_known(headers) {
        let mut refused = refusal(Code::Internal, grpc::BAD_ENCODING);
        let accept = HeaderValue::from_static(grpc::ACCEPT_ENCODING);
        refused.headers_mut().insert(grpc::GRPC_ACCEPT_ENCODING, accept);
        return refused;
    }
    if !shared.accepting.load(Ordering::Relaxed) {
        return refusal(Code::Unavailable, "the server is shutting down");
    }
    let index = method.unwrap_or(shared.unknown());
    if shared.token && method.is_none_or(|m| !shared.open[m]) {
        let admitted = method.is_some()
            && headers
                .get(http::header::AUTHORIZATION)
                .is_some_and(|v| shared.admitted.contains(v.as_bytes()));
        if !admitted {
            // Python decides on the headers alone: the message is read only once it admits the call
            if let Err(status) = check(&shared, index, headers.clone(), deadline).await {
                return status.into_http();
            }
        }
    }
    let Some(index) = method else {
        return refusal(Code::Unimplemented, grpc::METHOD_NOT_FOUND); // Python admitted an unknown method
    };
    let mut grpc = Grpc::new(BytesCodec)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .max_decoding_message_size(shared.max_message)
        // Python's answers are checked against the limit with grpc-core's status (PendingCall.reply/send)
        .max_encoding_message_size(usize::MAX);
    let call = (shared.clone(), index, deadline);
    let response = if shared.streaming[index] {
        grpc.streaming(Bidi::from(call), request).await
    } else {
        grpc.unary(Unary::from(call), request).await
    };
    as_grpc_core(response)
}

/// A refusal of tonic's decoder (a trailers-only response) in grpc-core's words; an answer with headers says
/// which encodings the server decodes, as grpc-core's do.
fn as_grpc_core(mut response: Response) -> Response {
    let Some(status) = Status::from_header_map(response.headers()) else {
        let accept = HeaderValue::from_static(grpc::ACCEPT_ENCODING);
        response.headers_mut().insert(grpc::GRPC_ACCEPT_ENCODING, accept);
        return response;
    };
    if let Some(status) = grpc::grpc_core_status(&status) {
        let headers = response.headers_mut();
        headers.remove(grpc::GRPC_MESSAGE);
        let _ = status.add_header(headers);
    }
    response
}

fn seconds_left(deadline: Option<Instant>) -> Option<f64> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64())
}

fn deadline_exceeded() -> Status {
    Status::deadline_exceeded("Deadline Exceeded")
}

/// Waits for `rx` until the deadline, telling Python when the call is given up unanswered.
async fn answer(
    shared: &Shared,
    id: u64,
    rx: oneshot::Receiver<Reply>,
    deadline: Option<Instant>,
) -> Result<Reply, Status> {
    let mut guard = Unanswered {
        id,
        shared,
        answered: false,
    };
    let reply = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline, rx).await {
            Ok(reply) => reply,
            Err(_) => return Err(deadline_exceeded()),
        },
        None => rx.await,
    };
    guard.answered = true;
    match reply {
        Ok(Reply::Err(code, message)) => Err(Status::new(Code::from(code as i32), message)),
        Ok(reply) => Ok(reply),
        Err(_) => Err(Status::internal("the handler ended without a response")),
    }
}

/// Python's verdict on a call's token, from its headers alone.
async fn check(shared: &Shared, method: usize, headers: HeaderMap, deadline: Option<Instant>) -> Result<(), Status> {
    let (tx, rx) = oneshot::channel();
    let id = shared.calls.fetch_add(1, Ordering::Relaxed);
    shared.push(Call {
        id,
        method,
        payload: None,
        headers,
        timeout: seconds_left(deadline),
        answer: Answer::Unary(tx),
        check: true,
    });
    match answer(shared, id, rx, deadline).await? {
        Reply::Admit => Ok(()),
        Reply::Ok(_) => Err(Status::internal("a token check was answered with a message")),
        Reply::Err(..) => unreachable!("answer() returns a status as Err"),
    }
}

struct Unary {
    shared: Arc<Shared>,
    index: usize,
    deadline: Option<Instant>,
}

impl From<(Arc<Shared>, usize, Option<Instant>)> for Unary {
    fn from((shared, index, deadline): (Arc<Shared>, usize, Option<Instant>)) -> Self {
        Unary {
            shared,
            index,
            deadline,
        }
    }
}

impl UnaryService<Bytes> for Unary {
    type Response = Bytes;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Bytes>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (shared, method, deadline) = (self.shared.clone(), self.index, self.deadline);
        Box::pin(async move {
            let (metadata, _, payload) = request.into_parts();
            let (tx, rx) = oneshot::channel();
            let id = shared.calls.fetch_add(1, Ordering::Relaxed);
            shared.push(Call {
                id,
                method,
                payload: Some(payload),
                headers: metadata.into_headers(),
                timeout: seconds_left(deadline),
                answer: Answer::Unary(tx),
                check: false,
            });
            match answer(&shared, id, rx, deadline).await? {
                Reply::Ok(message) => Ok(tonic::Response::new(message)),
                _ => Err(Status::internal("a call was answered as a token check")),
            }
        })
    }
}

/// A bidirectional stream: handed to Python at once; its request messages are read as Python asks.
struct Bidi {
    shared: Arc<Shared>,
    index: usize,
    deadline: Option<Instant>,
}

impl From<(Arc<Shared>, usize, Option<Instant>)> for Bidi {
    fn from((shared, index, deadline): (Arc<Shared>, usize, Option<Instant>)) -> Self {
        Bidi {
            shared,
            index,
            deadline,
        }
    }
}

impl StreamingService<Bytes> for Bidi {
    type Response = Bytes;
    type ResponseStream = Answers;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Answers>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let (shared, method, deadline) = (self.shared.clone(), self.index, self.deadline);
        Box::pin(async move {
            let (metadata, _, requests) = request.into_parts();
            let (out, rx) = mpsc::unbounded_channel();
            let permits = Arc::new(Semaphore::new(0));
            let backlog = Arc::new(Backlog::default());
            let id = shared.calls.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(read_requests(
                requests,
                id,
                shared.clone(),
                permits.clone(),
                out.clone(),
            ));
            shared.push(Call {
                id,
                method,
                payload: None,
                headers: metadata.into_headers(),
                timeout: seconds_left(deadline),
                answer: Answer::Stream {
                    out,
                    permits: permits.clone(),
                    backlog: backlog.clone(),
                },
                check: false,
            });
            Ok(tonic::Response::new(Answers {
                rx,
                deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
                done: false,
                id,
                shared,
                permits,
                backlog,
            }))
        })
    }
}

/// Reads a stream's request messages, one per permit (Python's `want`), and hands each to Python; a message
/// the decoder refuses ends the stream with that status.
async fn read_requests(
    mut requests: Streaming<Bytes>,
    id: u64,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    out: mpsc::UnboundedSender<Out>,
) {
    loop {
        match permits.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return, // the response has ended
        }
        match requests.message().await {
            Ok(message) => {
                let end = message.is_none();
                shared.deliver(id, message);
                if end {
                    return;
                }
            }
            Err(status) => {
                let status = grpc::grpc_core_status(&status).unwrap_or(status);
                let _ = out.send(Out::Status(status.code() as u32, status.message().to_owned()));
                shared.cancel(id);
                return;
            }
        }
    }
}

/// A stream's answers as Python sends them, then its status; DEADLINE_EXCEEDED at the deadline. Dropped before
/// the status (the client reset the stream): Python is told to cancel the call.
pub struct Answers {
    rx: mpsc::UnboundedReceiver<Out>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
    id: u64,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    backlog: Arc<Backlog>,
}

impl Answers {
    fn end(&mut self, status: Option<Status>) -> Poll<Option<Result<Bytes, Status>>> {
        self.done = true;
        self.permits.close(); // the request reader stops
        Poll::Ready(status.map(Err))
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.permits.close();
        if !self.done {
            self.shared.cancel(self.id);
        }
    }
}

impl Stream for Answers {
    type Item = Result<Bytes, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(Out::Message(message))) => {
                let before = this.backlog.queued.fetch_sub(1, Ordering::SeqCst);
                if before <= BACKLOG && this.backlog.waiting.swap(false, Ordering::SeqCst) {
                    this.shared.writable(this.id);
                }
                return Poll::Ready(Some(Ok(message)));
            }
            Poll::Ready(Some(Out::Status(0, _))) => return this.end(None),
            Poll::Ready(Some(Out::Status(code, message))) => {
                return this.end(Some(Status::new(Code::from(code as i32), message)))
            }
            Poll::Ready(None) => return this.end(Some(Status::internal("the handler ended without a status"))),
            Poll::Pending => {}
        }
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                this.shared.cancel(this.id);
                return this.end(Some(deadline_exceeded()));
            }
        }
        Poll::Pending
    }
}
