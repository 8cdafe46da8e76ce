//! The listener: tonic's server (HTTP/2, TLS with rustls, keepalive pings, max connection age with a graceful
//! GOAWAY) over our accepted sockets, each closed with a lingering close.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::handoff::Shared;
use crate::service::Catchall;

/// How long a finished connection's socket is drained before it is closed (`Socket`).
const LINGER: Duration = Duration::from_secs(1);

/// PEM files' contents for `--grpc-use-ssl`: the server's certificate chain and key, and with
/// `--grpc-use-ssl-mutual` the CA that signs the client certificates (then required).
pub struct Tls {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Option<Vec<u8>>,
}

pub struct Settings {
    /// each connection gets a graceful GOAWAY after this long (`--grpc-max-connection-age`)
    pub max_connection_age: Option<Duration>,
    /// then is closed this long after the GOAWAY if calls still run (`--grpc-max-connection-age-grace`)
    pub max_connection_age_grace: Option<Duration>,
    /// HTTP/2 PINGs on a connection quiet this long (`--grpc-keepalive-time`), closed when one is not answered
    /// within `keepalive_timeout` (`--grpc-keepalive-timeout`)
    pub keepalive_time: Option<Duration>,
    pub keepalive_timeout: Option<Duration>,
    pub tls: Option<Tls>,
}

/// tonic's server, configured (a bad certificate or key fails here, before anything listens).
pub fn builder(shared: &Shared, settings: Settings) -> Result<Server, String> {
    // h2's own header limit stays above ours, so that our check answers with grpc-core's status
    let header_list = shared
        .max_metadata
        .saturating_mul(4)
        .clamp(64 * 1024, u32::MAX as usize) as u32;
    let mut server = Server::builder()
        .max_concurrent_streams(Some(1024))
        .http2_max_header_list_size(Some(header_list))
        .http2_keepalive_interval(settings.keepalive_time)
        .http2_keepalive_timeout(settings.keepalive_timeout);
    if let Some(age) = settings.max_connection_age {
        server = server.max_connection_age(age);
    }
    if let Some(grace) = settings.max_connection_age_grace {
        server = server.max_connection_age_grace(grace);
    }
    if let Some(tls) = settings.tls {
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(tls.cert, tls.key));
        if let Some(ca) = tls.client_ca {
            config = config.client_ca_root(Certificate::from_pem(ca)); // required (client_auth_optional: false)
        }
        server = server.tls_config(config).map_err(|e| format!("TLS: {e}"))?;
    }
    Ok(server)
}

/// Serves until `stop` says so: then the listener closes, every connection gets a GOAWAY, and this returns
/// once they have all ended (`Transport.shutdown` bounds that wait).
pub async fn serve(server: Server, listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let counted = shared.clone();
    let incoming = TcpListenerStream::new(listener).map(move |accepted| {
        accepted.map(|stream| {
            let _ = stream.set_nodelay(true);
            counted.connections.fetch_add(1, Ordering::SeqCst);
            Socket {
                stream: Some(stream),
                open: Some(Open(counted.clone())),
            }
        })
    });
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let _ = server
        .serve_with_incoming_shutdown(Catchall { shared }, incoming, stopped)
        .await;
}

/// Counts a connection as open until its socket is closed (however its task ends).
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's socket, closed with a lingering close when the server is done with it.
///
/// After the last GOAWAY the client may still be sending: calls it opened before it read the GOAWAY (the
/// server ignores them, the client retries them on a new connection), pings, window updates. Closing a socket
/// with unread data makes the kernel answer with a TCP RST instead of the FIN, and the RST throws away what
/// the client has not read yet: the last responses and the GOAWAY itself, so those calls fail UNAVAILABLE
/// ("Connection reset by peer"). So, as nginx's lingering close and Go's closeWriteAndWait do, the socket's
/// write side is shut (FIN) and what still comes is read and dropped until the client closes its side, for at
/// most `LINGER`; the connection counts as open until then. (tonic's server closes sockets plainly.)
struct Socket {
    stream: Option<TcpStream>,
    open: Option<Open>,
}

impl Socket {
    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("the socket is open until dropped"))
    }
}

impl Connected for Socket {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match &self.stream {
            Some(stream) => stream.connect_info(),
            None => TcpConnectInfo {
                local_addr: None,
                remote_addr: None,
            },
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
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

async fn linger(mut stream: TcpStream, _open: Open) {
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
