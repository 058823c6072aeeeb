//! Accepting connections, with the limits `axum::serve` does not offer: at
//! most `max_connections` open at once (more wait in the listen backlog), a
//! deadline for a request's headers that also closes idle keep-alive
//! connections (a slowloris client holds a connection for
//! `header_timeout`, not forever), and a graceful stop that lets answers in
//! progress finish. The same loop serves TCP and a Unix-domain socket
//! (created with mode 0600: only its owner can connect).

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, watch};

use crate::ServerError;

/// Marks requests that came over the Unix-domain socket: no web page can
/// reach one, so the `Host` check against DNS rebinding does not apply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverUnixSocket;

/// Where connections come from.
pub(crate) trait Listener: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Listener for TcpListener {
    type Stream = tokio::net::TcpStream;

    async fn accept(&self) -> std::io::Result<Self::Stream> {
        let (stream, _) = TcpListener::accept(self).await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Listener for UnixListener {
    type Stream = tokio::net::UnixStream;

    async fn accept(&self) -> std::io::Result<Self::Stream> {
        UnixListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// A Unix-domain socket at `path` that only its owner can connect to: made
/// in a fresh directory of its own (mode 0700), given mode 0600, then
/// renamed into place, so it is never reachable with wider rights. A socket
/// left at `path` by a server that died is replaced; one a live server
/// answers on is not.
pub(crate) fn bind_unix_socket(path: &Path) -> Result<UnixListener, ServerError> {
    let io = |context: String| move |source| ServerError::Io { context, source };
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(ServerError::Io {
            context: format!("cannot listen on {}", path.display()),
            source: std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "a server is answering on it already",
            ),
        });
    }
    let parent = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let private = private_dir(&parent).map_err(io(format!(
        "cannot make a private directory in {}",
        parent.display()
    )))?;
    let staged = private.join("socket");
    let result = (|| {
        let listener = UnixListener::bind(&staged)
            .map_err(io(format!("cannot listen on {}", path.display())))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .map_err(io(format!("cannot restrict {}", path.display())))?;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(ServerError::Io {
                    context: format!("cannot listen on {}", path.display()),
                    source: std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "a file that is not a socket is there",
                    ),
                });
            }
        }
        std::fs::rename(&staged, path)
            .map_err(io(format!("cannot listen on {}", path.display())))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    result
}

/// A new directory in `parent` that only this user may enter.
fn private_dir(parent: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    for attempt in 0..100_u32 {
        let dir = parent.join(format!(".cortex-socket-{}-{attempt}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "no free name for a private directory",
    ))
}

/// The limits of the connection loop.
pub(crate) struct ConnectionLimits {
    pub(crate) header_timeout: Duration,
}

/// Largest request head (start line and headers): a client sending more
/// gets 431 and the connection closes.
const MAX_HEADER_BYTES: usize = 64 << 10;

/// Serves `app` on `listener` until `stop` says true, then waits for the
/// connections still open to finish their answers. Listeners served at
/// once share `permits` (the open connections of all of them).
pub(crate) async fn serve(
    listener: impl Listener,
    app: Router,
    limits: &ConnectionLimits,
    permits: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    let stop = async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
    };
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_headers(100)
        .max_buf_size(MAX_HEADER_BYTES);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(stream) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: wait, then go on
                    // (the connections open now will close).
                    tracing::warn!("accepting a connection: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!("connection ended: {error}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
