//! Python's side of the HTTP/1.1 transport (`http1.rs`): `HttpTransport` (the listener, its runtime and
//! eventfd; `take` drains the queue in one GIL acquisition) and `PendingRequest` (one request's answer: whole,
//! or a stream of chunks for server-sent events).

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::sync::{mpsc, oneshot, watch};

use crate::handoff::{lock, EventFd};
use crate::http1::{serve, Answer, HttpShared, Limits};

/// One request waiting for Python's answer.
#[pyclass(frozen, module = "kubeinfer_grpc_transport")]
pub struct PendingRequest {
    tx: Mutex<Option<oneshot::Sender<Answer>>>,
    out: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    #[pyo3(get)]
    id: u64,
}

fn head(status: u16, headers: Vec<(Vec<u8>, Vec<u8>)>) -> PyResult<(StatusCode, HeaderMap)> {
    let status = StatusCode::from_u16(status).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let name = HeaderName::from_bytes(&name).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let value = HeaderValue::from_bytes(&value).map_err(|e| PyValueError::new_err(e.to_string()))?;
        map.append(name, value);
    }
    Ok((status, map))
}

#[pymethods]
impl PendingRequest {
    /// Answer with a status, headers (`(name, value)` bytes pairs) and the whole body. False if the request
    /// is gone (its connection closed) or already answered.
    fn respond(&self, status: u16, headers: Vec<(Vec<u8>, Vec<u8>)>, body: &[u8]) -> PyResult<bool> {
        let (status, headers) = head(status, headers)?; // a bad header fails here, the request still open
        let Some(tx) = lock(&self.tx).take() else {
            return Ok(false);
        };
        Ok(tx
            .send(Answer::Full(status, headers, Bytes::copy_from_slice(body)))
            .is_ok())
    }

    /// Start a streamed answer (chunked): the status and headers go out now, then each `send`'s bytes, until
    /// `finish`. False if the request is gone or already answered.
    fn start(&self, status: u16, headers: Vec<(Vec<u8>, Vec<u8>)>) -> PyResult<bool> {
        let (status, headers) = head(status, headers)?;
        let Some(tx) = lock(&self.tx).take() else {
            return Ok(false);
        };
        let (out, chunks) = mpsc::unbounded_channel();
        *lock(&self.out) = Some(out);
        Ok(tx.send(Answer::Stream(status, headers, chunks)).is_ok())
    }

    /// One chunk of a streamed answer. False if the client went away (or the stream was finished).
    fn send(&self, chunk: &[u8]) -> bool {
        match lock(&self.out).as_ref() {
            Some(out) => out.send(Bytes::copy_from_slice(chunk)).is_ok(),
            None => false,
        }
    }

    /// End a streamed answer.
    fn finish(&self) -> bool {
        lock(&self.out).take().is_some()
    }

    /// True when nobody waits for the answer any more (the client went away).
    fn cancelled(&self) -> bool {
        if let Some(tx) = lock(&self.tx).as_ref() {
            return tx.is_closed();
        }
        match lock(&self.out).as_ref() {
            Some(out) => out.is_closed(),
            None => false,
        }
    }
}

/// The HTTP/1.1 listener and its runtime; `fd` becomes readable when requests are queued.
#[pyclass(frozen, module = "kubeinfer_grpc_transport")]
pub struct HttpTransport {
    shared: Arc<HttpShared>,
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
impl HttpTransport {
    /// Durations in milliseconds, 0 for none; `max_connections` 0 for none.
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (
        host, port, *, threads=1, max_body_bytes=64 * 1024 * 1024, max_header_bytes=16 * 1024,
        header_timeout_ms=30_000, body_timeout_ms=60_000, idle_timeout_ms=75_000, max_connections=0
    ))]
    fn new(
        host: &str,
        port: u16,
        threads: usize,
        max_body_bytes: usize,
        max_header_bytes: usize,
        header_timeout_ms: u64,
        body_timeout_ms: u64,
        idle_timeout_ms: u64,
        max_connections: usize,
    ) -> PyResult<Self> {
        let efd = EventFd::new().ok_or_else(|| PyOSError::new_err("eventfd failed"))?;
        let fd = efd.0;
        let limits = Limits {
            header_timeout: millis(header_timeout_ms),
            body_timeout: millis(body_timeout_ms),
            idle_timeout: millis(idle_timeout_ms),
            max_header: max_header_bytes,
            max_body: max_body_bytes,
            max_connections,
        };
        let shared = Arc::new(HttpShared::new(efd, limits));
        let failed = PyOSError::new_err;
        let shown = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let addr: SocketAddr = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| failed(format!("HTTP listener on {shown} failed to start: unknown address")))?;
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| failed(format!("HTTP listener on {addr} failed to start: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| failed(e.to_string()))?;
        let bound = listener.local_addr().map_err(|e| failed(e.to_string()))?.port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("http-transport")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let (stop, stop_rx) = watch::channel(false);
        {
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| failed(e.to_string()))?;
            runtime.spawn(serve(listener, shared.clone(), stop_rx));
        }
        Ok(HttpTransport {
            shared,
            stop,
            runtime: Mutex::new(Some(runtime)),
            port: bound,
            fd,
        })
    }

    /// `(requests, cancelled)`: every queued request as `(request, method, target, headers, body, client)` —
    /// target the path and query as sent, headers `(name, value)` bytes pairs (names lower-case), client
    /// `(host, port)` — and the ids of requests whose client went away, in one GIL acquisition.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyAny>)> {
        let (calls, cancelled) = self.shared.take();
        let cancelled = if cancelled.is_empty() {
            PyTuple::empty(py).into_any()
        } else {
            cancelled.into_pyobject(py)?.into_any()
        };
        let requests = PyList::empty(py);
        for call in calls {
            let headers = PyList::empty(py);
            for (name, value) in &call.headers {
                headers.append((
                    PyBytes::new(py, name.as_str().as_bytes()),
                    PyBytes::new(py, value.as_bytes()),
                ))?;
            }
            let pending = Bound::new(
                py,
                PendingRequest {
                    tx: Mutex::new(Some(call.answer)),
                    out: Mutex::new(None),
                    id: call.id,
                },
            )?;
            let client = (call.peer.ip().to_string(), call.peer.port());
            requests.append((
                pending,
                call.method.as_str(),
                call.target,
                headers,
                PyBytes::new(py, &call.body),
                client,
            ))?;
        }
        Ok((requests, cancelled))
    }

    /// (requests handed to Python, event-loop wake-ups) since start.
    fn stats(&self) -> (u64, u64) {
        (
            self.shared.calls.load(Ordering::Relaxed),
            self.shared.wakeups.load(Ordering::Relaxed),
        )
    }

    /// The listener closes; connections finish the request in flight and close.
    fn close(&self) {
        self.shared.accepting.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
    }

    /// Stop the runtime: connections get up to `timeout` seconds to write the answers already given and end,
    /// then whatever is left is dropped.
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

impl Drop for HttpTransport {
    fn drop(&mut self) {
        if let Some(rt) = lock(&self.runtime).take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
