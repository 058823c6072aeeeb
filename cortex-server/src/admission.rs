//! Admission control: at most `max_online_requests` online requests at once
//! (and `max_online_requests_per_key` for one API key), a 429 with
//! `Retry-After` beyond them; and a deadline for every request body, so a
//! client trickling its body cannot hold a request open.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use http_body::{Frame, SizeHint};
use tokio::time::Instant;

use crate::ServerConfig;
use crate::auth::Caller;
use crate::error::ApiError;

/// Online requests in progress, all of them and per API key, and their limits.
pub(crate) struct Admission {
    total: AtomicUsize,
    per_key: Vec<AtomicUsize>,
    /// `max_online_requests`.
    max_online_requests: usize,
    /// `max_online_requests_per_key` (0: no limit per key).
    max_online_requests_per_key: usize,
}

impl Admission {
    pub(crate) fn new(config: &ServerConfig) -> Arc<Self> {
        Arc::new(Self {
            total: AtomicUsize::new(0),
            per_key: (0..config.api_keys.len())
                .map(|_| AtomicUsize::new(0))
                .collect(),
            max_online_requests: config.max_online_requests,
            max_online_requests_per_key: config.max_online_requests_per_key,
        })
    }
}

/// Takes one place under `limit` in `count`, or none when it is full.
fn take(count: &AtomicUsize, limit: usize) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .is_ok()
}

/// A place taken by one online request; given back when its answer (the
/// whole stream, for streamed answers) is done or dropped.
struct Ticket {
    admission: Arc<Admission>,
    key: Option<usize>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let counts = &self.admission;
        counts.total.fetch_sub(1, Ordering::AcqRel);
        if let Some(key) = self.key {
            counts.per_key[key].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn enter(admission: &Arc<Admission>, key: Option<usize>) -> Result<Ticket, ApiError> {
    let counts = admission;
    let limit = admission.max_online_requests.max(1);
    if !take(&counts.total, limit) {
        return Err(ApiError::too_many_requests(format!(
            "the server is answering {limit} online requests, its limit (max_online_requests); try again shortly"
        )));
    }
    let per_key = admission.max_online_requests_per_key;
    let key = key.filter(|_| per_key > 0);
    if let Some(key) = key
        && !take(&counts.per_key[key], per_key)
    {
        counts.total.fetch_sub(1, Ordering::AcqRel);
        return Err(ApiError::too_many_requests(format!(
            "this API key has {per_key} online requests in progress, its limit (max_online_requests_per_key); try again shortly"
        )));
    }
    Ok(Ticket {
        admission: Arc::clone(admission),
        key,
    })
}

/// The middleware of the online routes.
pub(crate) async fn admit_online(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    let key = request.extensions().get::<Caller>().and_then(|c| c.key);
    let path = request.uri().path().to_owned();
    let ticket = match enter(&admission, key) {
        Ok(ticket) => ticket,
        Err(refusal) => {
            let mut response = refusal.for_path(&path);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
    };
    next.run(request).await.map(|body| {
        Body::new(TicketBody {
            body,
            _ticket: ticket,
        })
    })
}

/// An answer's body holding its request's place until it ends.
struct TicketBody {
    body: Body,
    /// Never read: held for its `Drop`, which gives the place back.
    _ticket: Ticket,
}

impl http_body::Body for TicketBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body must arrive within `body_timeout` of the request's
/// headers (an upload to `/v1/files`, which may be large, within
/// `body_timeout` of its last bytes); past it, reading the body fails and
/// the request is refused.
pub(crate) async fn body_deadline(
    State(timeout): State<std::time::Duration>,
    request: Request,
    next: Next,
) -> Response {
    let idle_only = request.uri().path() == crate::files::ROUTE;
    let request = request.map(|body| {
        let start = (Some(body.into_data_stream()), Instant::now() + timeout);
        let frames = futures_util::stream::unfold(start, move |(rest, deadline)| async move {
            let mut frames = rest?;
            match tokio::time::timeout_at(deadline, frames.next()).await {
                Ok(Some(Ok(bytes))) => {
                    let next = if idle_only {
                        Instant::now() + timeout
                    } else {
                        deadline
                    };
                    Some((Ok(bytes), (Some(frames), next)))
                }
                Ok(Some(Err(error))) => Some((Err(io::Error::other(error)), (None, deadline))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the request body did not arrive within {} s (body_timeout)",
                            timeout.as_secs()
                        ),
                    )),
                    (None, deadline),
                )),
            }
        });
        Body::from_stream(frames)
    });
    next.run(request).await
}
