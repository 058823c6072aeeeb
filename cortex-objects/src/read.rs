//! Reading an object in ranges, each pinned to the version first seen.

use std::io::{self, Read};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use tokio::task::JoinHandle;

use crate::runtime::{block_on, runtime};
use crate::{ObjectError, ObjectLocation};

/// Bytes fetched per request when an object is read as a stream.
const STREAM_RANGE: u64 = 8 << 20;

/// An object opened for reading: its size and the version every range
/// asks for.
#[derive(Debug, Clone)]
pub struct RemoteObject {
    pinned: Arc<Pinned>,
    size: u64,
}

/// What a range request needs, shared with prefetches on the runtime.
#[derive(Debug)]
struct Pinned {
    location: ObjectLocation,
    etag: Option<String>,
    version: Option<String>,
}

impl ObjectLocation {
    /// Looks the object up (its size and ETag): a missing object, a refused
    /// credential or an unreachable store is an error here.
    pub fn open(&self) -> Result<RemoteObject, ObjectError> {
        let meta = block_on(self.store.head(&self.path))
            .map_err(|e| self.explain(ObjectError::from_store(self.url(), None, e)))?;
        Ok(RemoteObject {
            pinned: Arc::new(Pinned {
                location: self.clone(),
                etag: meta.e_tag,
                version: meta.version,
            }),
            size: meta.size,
        })
    }
}

impl Pinned {
    fn url(&self) -> &str {
        self.location.url()
    }

    fn seen(&self) -> Option<&str> {
        self.etag.as_deref().or(self.version.as_deref())
    }

    async fn fetch(
        store: Arc<dyn ObjectStore>,
        path: StorePath,
        pinned: Arc<Pinned>,
        range: Range<u64>,
    ) -> Result<Bytes, ObjectError> {
        let options = GetOptions {
            if_match: pinned.etag.clone(),
            range: Some(GetRange::Bounded(range.clone())),
            ..GetOptions::default()
        };
        let fail = |e| ObjectError::from_store(pinned.url(), pinned.seen(), e);
        let result = store.get_opts(&path, options).await.map_err(fail)?;
        // A store that ignores If-Match still says which version it sent.
        let changed = (pinned.etag.is_some() && result.meta.e_tag != pinned.etag)
            || (pinned.etag.is_none()
                && pinned.version.is_some()
                && result.meta.version != pinned.version);
        if changed {
            return Err(ObjectError::Changed {
                url: pinned.url().to_owned(),
                etag: pinned.seen().unwrap_or("unknown").to_owned(),
            });
        }
        let bytes = result.bytes().await.map_err(fail)?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(ObjectError::Store {
                url: pinned.url().to_owned(),
                detail: format!(
                    "asked for bytes {}..{}, got {}",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    fn spawn_fetch(self: &Arc<Self>, range: Range<u64>) -> JoinHandle<Result<Bytes, ObjectError>> {
        runtime().spawn(Self::fetch(
            Arc::clone(&self.location.store),
            self.location.path.clone(),
            Arc::clone(self),
            range,
        ))
    }
}

impl RemoteObject {
    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        self.pinned.url()
    }

    /// Bytes `range` (clipped to the object's end) of the version first
    /// seen.
    pub fn read_range(&self, range: Range<u64>) -> Result<Bytes, ObjectError> {
        let range = range.start.min(self.size)..range.end.min(self.size);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let pinned = &self.pinned;
        block_on(Pinned::fetch(
            Arc::clone(&pinned.location.store),
            pinned.location.path.clone(),
            Arc::clone(pinned),
            range,
        ))
    }

    /// The whole object as a stream ([`Read`]).
    pub fn reader(&self) -> ObjectReader {
        ObjectReader {
            object: self.clone(),
            current: Bytes::new(),
            next: 0,
            pending: None,
        }
    }
}

/// An object read front to back, 8 MiB per request, the next range fetched
/// while this one is read.
#[derive(Debug)]
pub struct ObjectReader {
    object: RemoteObject,
    current: Bytes,
    /// Where the next fetch starts.
    next: u64,
    pending: Option<JoinHandle<Result<Bytes, ObjectError>>>,
}

impl ObjectReader {
    fn start_next(&mut self) {
        if self.pending.is_none() && self.next < self.object.size {
            let end = (self.next + STREAM_RANGE).min(self.object.size);
            self.pending = Some(self.object.pinned.spawn_fetch(self.next..end));
            self.next = end;
        }
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.current.is_empty() {
            self.start_next();
            let Some(pending) = self.pending.take() else {
                return Ok(0);
            };
            self.current = block_on(pending).map_err(io::Error::other)??;
            self.start_next();
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

impl Drop for ObjectReader {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.abort();
        }
    }
}
