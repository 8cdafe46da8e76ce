//! The hand-off between tokio and Python's event loop: queues behind mutexes and an eventfd that is written only
//! when a queue goes from empty to non-empty, so a busy event loop is woken once for many calls.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// A stream's messages sent by Python and not yet taken by HTTP/2 (which takes them as the client's flow
/// control window allows): past this many, Python waits (`PendingCall.full`). A reader that keeps up never
/// lets them pile up; one that reads slowly holds at most this many here, as grpc.aio holds one per write.
pub const BACKLOG: usize = 8;

/// Python's answer to a unary call, or to a token check.
pub enum Reply {
    Ok(Bytes),
    Err(u32, String),
    /// the token check passed: read the message and hand the call over
    Admit,
}

/// What Python writes on a stream: a message, or the final status.
pub enum Out {
    Message(Bytes),
    Status(u32, String),
}

/// How a call is answered.
pub enum Answer {
    /// one reply (a unary call, or a token check before one)
    Unary(oneshot::Sender<Reply>),
    /// messages then a status
    Stream {
        out: mpsc::UnboundedSender<Out>,
        /// one permit per request message Python asked for
        permits: Arc<Semaphore>,
        backlog: Arc<Backlog>,
    },
}

/// How many of a stream's messages wait in its channel, and whether Python waits for room.
#[derive(Default)]
pub struct Backlog {
    pub queued: AtomicUsize,
    pub waiting: AtomicBool,
}

pub struct Call {
    pub id: u64,
    pub method: usize,
    /// the request message (None: a stream, whose messages come one by one, or a token check)
    pub payload: Option<Bytes>,
    pub headers: HeaderMap,
    /// seconds left before the call's deadline
    pub timeout: Option<f64>,
    pub answer: Answer,
    /// a token check (its headers only: the message is read once Python admits the call)
    pub check: bool,
}

/// The `authorization` values Python accepted lately: a call carrying one of them is read and handed over at
/// once (Python checks it again, as every call); any other waits for Python's verdict before its message is
/// read. Python's refusal of a call carrying one removes it (a revoked or rotated token).
pub struct Admitted {
    values: Mutex<Vec<Bytes>>,
}

/// Admitted values kept (clients of one server send one or two forms of the token).
const ADMITTED: usize = 8;

impl Admitted {
    pub fn new() -> Self {
        Admitted {
            values: Mutex::new(Vec::new()),
        }
    }

    /// Constant-time over the value's bytes (the length is not hidden, as with hmac.compare_digest).
    pub fn contains(&self, value: &[u8]) -> bool {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        values.iter().any(|known| constant_time_eq(known, value))
    }

    pub fn add(&self, value: &[u8]) {
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        if !values.iter().any(|known| known[..] == *value) {
            if values.len() == ADMITTED {
                values.remove(0);
            }
            values.push(Bytes::copy_from_slice(value));
        }
    }

    pub fn remove(&self, value: &[u8]) {
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        values.retain(|known| known[..] != *value);
    }
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// An eventfd, closed when dropped (after the runtime whose tasks write it).
pub struct EventFd(pub RawFd);

impl EventFd {
    /// A non-blocking eventfd (None: the system refused one).
    pub fn new() -> Option<EventFd> {
        // SAFETY: a plain syscall; the fd is ours until Drop closes it
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        (fd >= 0).then_some(EventFd(fd))
    }

    /// Makes the fd readable (Python's event loop wakes up).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd; it only fails when the counter would
        // overflow, and then the fd is readable already
        unsafe { libc::write(self.0, &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Resets the counter (EAGAIN when it was not written): anything queued after this writes it again.
    pub fn drain(&self) {
        let mut counter: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd
        unsafe { libc::read(self.0, &mut counter as *mut u64 as *mut libc::c_void, 8) };
    }
}

/// Queues `item`, waking the event loop only when the queue goes from empty to non-empty (true then): a busy
/// loop is woken once for many items, and drains them all in one GIL acquisition.
pub fn push_waking<T>(queue: &Mutex<Vec<T>>, item: T, efd: &EventFd) -> bool {
    let was_empty = {
        let mut q = lock(queue);
        let empty = q.is_empty();
        q.push(item);
        empty
    };
    if was_empty {
        efd.wake();
    }
    was_empty
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: the fd is ours and nothing uses it any more (every holder of Shared is gone)
        unsafe { libc::close(self.0) };
    }
}

pub struct Shared {
    pub methods: HashMap<String, usize>,
    /// by method index: bidirectional streaming
    pub streaming: Vec<bool>,
    /// by method index: callable without the token (the probes)
    pub open: Vec<bool>,
    /// --auth-token-file: every other call's `authorization` header is checked before its message is read;
    /// calls to unknown methods go to Python as method index `streaming.len()` (it checks the token before
    /// answering UNIMPLEMENTED, as grpc.aio's interceptor runs before its method lookup)
    pub token: bool,
    pub admitted: Admitted,
    pub queue: Mutex<Vec<Call>>,
    /// request messages of streams, by call id (None: the client ended its side)
    pub messages: Mutex<Vec<(u64, Option<Bytes>)>>,
    /// ids of calls whose client went away (stream reset, deadline) before Python answered
    pub cancelled: Mutex<Vec<u64>>,
    /// ids of streams whose backlog went below BACKLOG while Python waited for room
    pub writable: Mutex<Vec<u64>>,
    pub efd: EventFd,
    pub max_message: usize,
    /// largest request metadata (HPACK size: name + value + 32 per entry, pseudo-headers too); 0: none
    pub max_metadata: usize,
    pub accepting: AtomicBool,
    pub calls: AtomicU64,
    pub wakeups: AtomicU64,
    /// open connections (a closed one's socket until its lingering close ends): `shutdown` waits for them
    pub connections: AtomicUsize,
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// The method index of calls to methods this server does not have.
    pub fn unknown(&self) -> usize {
        self.streaming.len()
    }

    fn wake(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        self.efd.wake();
    }

    pub fn push(&self, call: Call) {
        if push_waking(&self.queue, call, &self.efd) {
            self.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn deliver(&self, id: u64, message: Option<Bytes>) {
        if push_waking(&self.messages, (id, message), &self.efd) {
            self.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn cancel(&self, id: u64) {
        lock(&self.cancelled).push(id);
        self.wake();
    }

    pub fn writable(&self, id: u64) {
        lock(&self.writable).push(id);
        self.wake();
    }

    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *lock(&self.queue))
    }

    pub fn take_messages(&self) -> Vec<(u64, Option<Bytes>)> {
        std::mem::take(&mut *lock(&self.messages))
    }

    pub fn take_ids(list: &Mutex<Vec<u64>>) -> Vec<u64> {
        std::mem::take(&mut *lock(list))
    }
}

/// Tells Python a call was given up (its tokio task dropped: stream reset, deadline) unless it was answered.
pub struct Unanswered<'a> {
    pub id: u64,
    pub shared: &'a Shared,
    pub answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.cancel(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitted_values_are_compared_as_bytes() {
        let admitted = Admitted::new();
        assert!(!admitted.contains(b"Bearer a"));
        admitted.add(b"Bearer a");
        assert!(admitted.contains(b"Bearer a"));
        assert!(!admitted.contains(b"Bearer b") && !admitted.contains(b"Bearer a ") && !admitted.contains(b""));
        admitted.add("Bearer t\u{f6}k\u{e9}n\u{20ac}".as_bytes()); // any bytes: nothing is decoded
        assert!(admitted.contains("Bearer t\u{f6}k\u{e9}n\u{20ac}".as_bytes()));
        admitted.remove(b"Bearer a");
        assert!(!admitted.contains(b"Bearer a"));
    }

    #[test]
    fn at_most_a_few_values_are_kept() {
        let admitted = Admitted::new();
        for i in 0..=ADMITTED {
            admitted.add(format!("Bearer {i}").as_bytes());
        }
        assert!(!admitted.contains(b"Bearer 0"));
        assert!(admitted.contains(format!("Bearer {ADMITTED}").as_bytes()));
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
