//! A gRPC transport for Python: tonic's server on a tokio runtime in background threads, each call handed to
//! Python's event loop as raw bytes.
//!
//! tonic does HTTP/2 (hyper, h2), TLS (rustls), keepalive pings, max connection age with a graceful GOAWAY,
//! the gRPC framing, compression, size limits and statuses (`server.rs`, `service.rs`: one catch-all
//! service with a raw-bytes codec). What tonic leaves to us is small and listed where it is:
//! - `grpc.rs`: grpc-core's behaviour where tonic's differs (Triton's server is grpc-core): its texts for
//!   refusals, its reading of `grpc-timeout` and `grpc-encoding`, its metadata hard limit.
//! - `handoff.rs`: the hand-off, which is where the CPU goes. tokio threads never take the GIL: a call (method
//!   index, message bytes, headers, timeout, a oneshot sender) goes into a mutex-guarded queue, and an eventfd
//!   is written only when the queue goes from empty to non-empty, so a busy event loop is woken once for many
//!   calls. Python (`Transport.take`, registered with `loop.add_reader` on `Transport.fd`) drains every queue
//!   in one GIL acquisition; `PendingCall.reply(bytes)` / `.abort(code, message)` complete the oneshot
//!   without blocking.
//! - `service.rs`: the token is checked on the headers before the message is read (`Shared.admitted`, else
//!   Python's verdict first); deadlines (`grpc-timeout`) end a call with DEADLINE_EXCEEDED whatever Python
//!   does; a client that resets its stream cancels the call in Python. Bidirectional streams
//!   (ModelStreamInfer) are handed over at once; each request message is read only when Python asks for one
//!   (`PendingCall.want`), so a handler that stops reading holds the client back by HTTP/2 flow control. At
//!   most `BACKLOG` of a stream's answers wait here for a client that reads slowly: then `full()` says so and
//!   Python waits until the stream's id comes out of `take` as writable (tonic has no such back-pressure).
//! - `server.rs`: a lingering close of each socket, so a client's late frames do not turn the FIN into an RST
//!   that destroys the last answers (tonic closes plainly).
//!
//! `http1.rs` (Python's side: `http_python.rs`) serves HTTP/1.1 with hyper through the same hand-off.
//!
//! h2 is built with one fix from `patches/` (a WINDOW_UPDATE racing the final GOAWAY; patches/README.md).

mod grpc;
mod handoff;
mod http1;
mod http_python;
mod server;
mod service;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use handoff::{Admitted, Answer, Backlog, EventFd, Out, Reply, Shared, BACKLOG};

const RESOURCE_EXHAUSTED: u32 = 8;
const UNAUTHENTICATED: u32 = 16;

/// One call waiting for Python's answer (or a token check, answered with `admit` or `refuse`).
#[pyclass(frozen, module = "kubeinfer_grpc_transport")]
struct PendingCall {
    /// a unary call's answer, or a token check's verdict
    tx: Mutex<Option<oneshot::Sender<Reply>>>,
    /// a stream's messages and status
    out: Mutex<Option<mpsc::UnboundedSender<Out>>>,
    permits: Option<Arc<Semaphore>>,
    backlog: Option<Arc<Backlog>>,
    headers: HeaderMap,
    #[pyo3(get)]
    timeout: Option<f64>,
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl PendingCall {
    /// Answer a unary call with a serialized response message (one over --grpc-max-message-bytes:
    /// RESOURCE_EXHAUSTED instead, as grpc-core answers it). False if the call is already gone.
    fn reply(&self, message: &[u8]) -> bool {
        let Some(tx) = lock(&self.tx).take() else {
            return false;
        };
        let max = self.shared.max_message;
        if message.len() > max {
            let refused = Reply::Err(RESOURCE_EXHAUSTED, grpc::sent_too_large(message.len(), max));
            return tx.send(refused).is_ok();
        }
        tx.send(Reply::Ok(Bytes::copy_from_slice(message))).is_ok()
    }

    /// Write one serialized message on a stream. False if the stream is gone or finished, or if the message is
    /// over the limit: then the stream ends with RESOURCE_EXHAUSTED, as grpc ends it.
    fn send(&self, message: &[u8]) -> bool {
        let mut out = lock(&self.out);
        let max = self.shared.max_message;
        if message.len() > max {
            if let Some(out) = out.take() {
                let _ = out.send(Out::Status(
                    RESOURCE_EXHAUSTED,
                    grpc::sent_too_large(message.len(), max),
                ));
            }
            return false;
        }
        let (Some(out), Some(backlog)) = (out.as_ref(), &self.backlog) else {
            return false;
        };
        backlog.queued.fetch_add(1, Ordering::SeqCst);
        out.send(Out::Message(Bytes::copy_from_slice(message))).is_ok()
    }

    /// True when BACKLOG of this stream's messages wait for the client: send no more until the stream's id
    /// comes out of `take` as writable (or the call is cancelled).
    fn full(&self) -> bool {
        let Some(backlog) = &self.backlog else {
            return false;
        };
        if backlog.queued.load(Ordering::SeqCst) < BACKLOG {
            return false;
        }
        backlog.waiting.store(true, Ordering::SeqCst);
        // read again after announcing the wait: a message taken in between did not see it (a notice for a wait
        // that did not happen is harmless)
        backlog.queued.load(Ordering::SeqCst) >= BACKLOG
    }

    /// End a stream with status OK.
    fn finish(&self) -> bool {
        self.abort(0, "")
    }

    /// Answer with a gRPC status (code as an int) and its message; a stream ends with it.
    fn abort(&self, code: u32, message: &str) -> bool {
        if let Some(tx) = lock(&self.tx).take() {
            return tx.send(Reply::Err(code, message.to_owned())).is_ok();
        }
        if let Some(out) = lock(&self.out).take() {
            return out.send(Out::Status(code, message.to_owned())).is_ok();
        }
        false
    }

    /// A token check passed: the transport reads the call's message and hands the call over (it comes out of
    /// `take` again, as a call), and takes this `authorization` value without asking next time.
    fn admit(&self) -> bool {
        let Some(tx) = lock(&self.tx).take() else {
            return false;
        };
        if let Some(value) = self.headers.get(http::header::AUTHORIZATION) {
            self.shared.admitted.add(value.as_bytes());
        }
        tx.send(Reply::Admit).is_ok()
    }

    /// UNAUTHENTICATED with `message`; the transport stops taking this call's `authorization` value without
    /// asking (a revoked token).
    fn refuse(&self, message: &str) -> bool {
        if let Some(value) = self.headers.get(http::header::AUTHORIZATION) {
            self.shared.admitted.remove(value.as_bytes());
        }
        self.abort(UNAUTHENTICATED, message)
    }

    /// Let the transport read one more request message of this stream (it comes out of `take`).
    fn want(&self) {
        if let Some(permits) = &self.permits {
            permits.add_permits(1);
        }
    }

    /// True when nobody waits for the answer any more (client reset the stream, deadline passed).
    fn cancelled(&self) -> bool {
        if let Some(tx) = lock(&self.tx).as_ref() {
            return tx.is_closed();
        }
        match lock(&self.out).as_ref() {
            Some(out) => out.is_closed(),
            None => true,
        }
    }

    /// The `authorization` header's value as sent, bytes (None without one).
    fn authorization<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.headers
            .get(http::header::AUTHORIZATION)
            .map(|v| PyBytes::new(py, v.as_bytes()))
    }

    /// One metadata value (the first, as text: bytes that are not UTF-8 are replaced), or None.
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

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

#[pymethods]
impl Transport {
    /// `methods`: the unary methods' paths, then `streams`: the bidirectional streaming ones'; a call's method
    /// index counts through both. `token`: every call but those to `open` paths is checked (`take`'s checks)
    /// before its message is read, and a call to any other path comes out of `take` as a check with the index
    /// one past the last, for Python to answer; without it the transport answers those UNIMPLEMENTED.
    /// `tls_cert`/`tls_key` (PEM bytes): serve TLS, requiring client certificates signed by `tls_client_ca`
    /// when given. Durations in milliseconds, 0 for none.
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (
        host, port, methods, streams=Vec::new(), *, open=Vec::new(), token=false, threads=1,
        max_message_bytes=64 * 1024 * 1024, max_metadata_bytes=0, max_connection_age_ms=0,
        max_connection_age_grace_ms=0, keepalive_time_ms=0, keepalive_timeout_ms=0, tls_cert=None, tls_key=None,
        tls_client_ca=None
    ))]
    fn new(
        host: &str,
        port: u16,
        methods: Vec<String>,
        streams: Vec<String>,
        open: Vec<String>,
        token: bool,
        threads: usize,
        max_message_bytes: usize,
        max_metadata_bytes: usize,
        max_connection_age_ms: u64,
        max_connection_age_grace_ms: u64,
        keepalive_time_ms: u64,
        keepalive_timeout_ms: u64,
        tls_cert: Option<Vec<u8>>,
        tls_key: Option<Vec<u8>>,
        tls_client_ca: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        // SAFETY: a plain syscall; the fd is ours until Drop closes it
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(PyOSError::new_err("eventfd failed"));
        }
        let efd = EventFd(efd);
        let fd = efd.0;
        let paths: Vec<String> = methods.iter().chain(&streams).cloned().collect();
        let streaming = methods
            .iter()
            .map(|_| false)
            .chain(streams.iter().map(|_| true))
            .collect();
        let shared = Arc::new(Shared {
            open: paths.iter().map(|p| open.contains(p)).collect(),
            methods: paths
                .into_iter()
                .enumerate()
                .map(|(i, m)| (m, i))
                .collect::<HashMap<_, _>>(),
            streaming,
            token,
            admitted: Admitted::new(),
            queue: Mutex::new(Vec::with_capacity(64)),
            messages: Mutex::new(Vec::new()),
            cancelled: Mutex::new(Vec::new()),
            writable: Mutex::new(Vec::new()),
            efd,
            max_message: max_message_bytes,
            max_metadata: max_metadata_bytes,
            accepting: AtomicBool::new(true),
            calls: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
        });
        let failed = PyOSError::new_err;
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(server::Tls {
                cert,
                key,
                client_ca: tls_client_ca,
            }),
            (None, None) => None,
            _ => return Err(failed("TLS needs both a certificate and a key".into())),
        };
        let settings = server::Settings {
            max_connection_age: millis(max_connection_age_ms),
            max_connection_age_grace: millis(max_connection_age_grace_ms),
            keepalive_time: millis(keepalive_time_ms),
            keepalive_timeout: millis(keepalive_timeout_ms),
            tls,
        };
        // an IP address, or a name resolved as grpc resolves it (the first address)
        let shown = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let builder =
            server::builder(&shared, settings).map_err(|e| failed(format!("gRPC listener on {shown}: {e}")))?;
        let addr: SocketAddr = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| failed(format!("gRPC listener on {shown} failed to start: unknown address")))?;
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| failed(format!("gRPC listener on {addr} failed to start: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| failed(e.to_string()))?;
        let bound = listener.local_addr().map_err(|e| failed(e.to_string()))?.port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("grpc-transport")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let (stop, stop_rx) = watch::channel(false);
        {
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| failed(e.to_string()))?;
            runtime.spawn(server::serve(builder, listener, shared.clone(), stop_rx));
        }
        Ok(Transport {
            shared,
            stop,
            runtime: Mutex::new(Some(runtime)),
            port: bound,
            fd,
        })
    }

    /// `(calls, cancelled, messages, writable, checks)`: every queued call as `(call, method_index, payload,
    /// call_id)` (payload None for a stream), the ids of calls given up by their client (stream reset,
    /// deadline), streams' request messages as `(call_id, payload)` (None: the client ended its side), the ids
    /// of streams with room again after `full()` said True, and the token checks as `(call, method_index)`
    /// (answer each with `admit` or `refuse`/`abort`) — one GIL acquisition for all of them. The eventfd is
    /// read first, then the cancellations, the calls and the messages: a call always comes out no later than
    /// its cancellation (a stream's messages come only after Python asked, so after its call), and anything
    /// queued after the read writes the eventfd again.
    #[allow(clippy::type_complexity)]
    fn take<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyList>,
        Bound<'py, PyAny>,
        Bound<'py, PyList>,
        Bound<'py, PyAny>,
        Bound<'py, PyList>,
    )> {
        let mut counter: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd (EAGAIN when it was not written)
        unsafe { libc::read(self.shared.efd.0, &mut counter as *mut u64 as *mut libc::c_void, 8) };
        let ids = |list: &Mutex<Vec<u64>>| -> PyResult<Bound<'py, PyAny>> {
            let taken = Shared::take_ids(list);
            Ok(if taken.is_empty() {
                PyTuple::empty(py).into_any()
            } else {
                taken.into_pyobject(py)?.into_any()
            })
        };
        let cancelled = ids(&self.shared.cancelled)?;
        let writable = ids(&self.shared.writable)?;
        let calls = PyList::empty(py);
        let checks = PyList::empty(py);
        for call in self.shared.take_calls() {
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
                    shared: self.shared.clone(),
                },
            )?;
            if call.check {
                checks.append((pending, call.method))?;
            } else {
                let payload = call.payload.map(|p| PyBytes::new(py, &p));
                calls.append((pending, call.method, payload, call.id))?;
            }
        }
        let delivered = PyList::empty(py);
        for (id, message) in self.shared.take_messages() {
            delivered.append((id, message.map(|m| PyBytes::new(py, &m))))?;
        }
        Ok((calls, cancelled, delivered, writable, checks))
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
        let runtime = lock(&self.runtime).take();
        if let Some(rt) = runtime {
            let shared = self.shared.clone();
            let timeout = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::ZERO);
            py.detach(|| {
                rt.block_on(async {
                    let _ = tokio::time::timeout(timeout, async {
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
        // the runtime's tasks hold the eventfd (Shared): they end here, and the last holder closes it
        if let Some(rt) = lock(&self.runtime).take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

#[pymodule]
fn kubeinfer_grpc_transport(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Transport>()?;
    m.add_class::<PendingCall>()?;
    m.add_class::<http_python::HttpTransport>()?;
    m.add_class::<http_python::PendingRequest>()?;
    Ok(())
}
