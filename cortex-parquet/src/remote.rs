//! A Parquet file in an object store, read in cached blocks.
//!
//! Parquet's reader asks for a footer, then each page's header and data
//! (small reads, columns interleaved): one request each would be thousands
//! of round trips. Reads are served from 4 MiB blocks fetched as needed, at
//! most 16 kept (64 MiB), the least recently used dropped first.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::ops::{Range, RangeInclusive};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use cortex_objects::RemoteObject;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

const BLOCK: u64 = 4 << 20;
const BLOCKS_KEPT: usize = 16;

/// A remote object as Parquet's [`ChunkReader`].
#[derive(Clone)]
pub(crate) struct ObjectChunks {
    inner: Arc<Inner>,
}

struct Inner {
    object: RemoteObject,
    blocks: Mutex<Blocks>,
}

#[derive(Default)]
struct Blocks {
    kept: HashMap<u64, Bytes>,
    /// Block numbers, least recently used first.
    order: VecDeque<u64>,
}

impl Blocks {
    fn touch(&mut self, block: u64) {
        self.order.retain(|&b| b != block);
        self.order.push_back(block);
    }

    fn keep(&mut self, block: u64, bytes: Bytes) {
        self.kept.insert(block, bytes);
        self.touch(block);
        while self.order.len() > BLOCKS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.kept.remove(&old);
            }
        }
    }

    /// Makes blocks `wanted` (at most half the cache) present, fetching the
    /// missing run in one request (`fetch` gets its byte range); the ones
    /// already kept are used first, so that keeping the new ones never drops
    /// a block of `wanted`.
    fn ensure(
        &mut self,
        wanted: RangeInclusive<u64>,
        fetch: impl FnOnce(Range<u64>) -> io::Result<Bytes>,
    ) -> io::Result<()> {
        let missing: Vec<u64> = wanted
            .clone()
            .filter(|b| !self.kept.contains_key(b))
            .collect();
        for block in wanted {
            if self.kept.contains_key(&block) {
                self.touch(block);
            }
        }
        if let (Some(&from), Some(&to)) = (missing.first(), missing.last()) {
            let fetched = fetch(from * BLOCK..(to + 1) * BLOCK)?;
            for block in from..=to {
                let offset = (((block - from) * BLOCK) as usize).min(fetched.len());
                let size = (BLOCK as usize).min(fetched.len() - offset);
                self.keep(block, fetched.slice(offset..offset + size));
            }
        }
        Ok(())
    }
}

impl ObjectChunks {
    pub(crate) fn new(object: RemoteObject) -> Self {
        Self {
            inner: Arc::new(Inner {
                object,
                blocks: Mutex::default(),
            }),
        }
    }

    /// `length` bytes from `start` (fewer at the object's end).
    fn bytes(&self, start: u64, length: u64) -> io::Result<Bytes> {
        let object = &self.inner.object;
        let end = (start + length).min(object.len());
        if start >= end {
            return Ok(Bytes::new());
        }
        // A read larger than the cache goes straight to the store.
        if end - start > BLOCK * (BLOCKS_KEPT as u64 / 2) {
            return Ok(object.read_range(start..end)?);
        }
        let (first, last) = (start / BLOCK, (end - 1) / BLOCK);
        let mut blocks = self
            .inner
            .blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        blocks.ensure(first..=last, |range| {
            Ok(object.read_range(range.start..range.end.min(object.len()))?)
        })?;
        let mut out = BytesMut::with_capacity((end - start) as usize);
        // `ensure` made every block present and most recently used.
        for block in first..=last {
            let bytes = &blocks.kept[&block];
            let from = start.saturating_sub(block * BLOCK) as usize;
            let to = ((end - block * BLOCK) as usize).min(bytes.len());
            if first == last {
                return Ok(bytes.slice(from..to));
            }
            out.extend_from_slice(&bytes[from..to]);
        }
        Ok(out.freeze())
    }
}

impl Length for ObjectChunks {
    fn len(&self) -> u64 {
        self.inner.object.len()
    }
}

/// Sequential reads from an offset, a block at a time.
pub(crate) struct ChunkRead {
    chunks: ObjectChunks,
    position: u64,
    current: Bytes,
}

impl Read for ChunkRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.current.is_empty() {
            let to_block_end = BLOCK - self.position % BLOCK;
            self.current = self.chunks.bytes(self.position, to_block_end)?;
            self.position += self.current.len() as u64;
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

impl ChunkReader for ObjectChunks {
    type T = ChunkRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<ChunkRead> {
        Ok(ChunkRead {
            chunks: self.clone(),
            position: start,
            current: Bytes::new(),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.bytes(start, length as u64)
            .map_err(|e| ParquetError::External(Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetching_a_missing_block_never_drops_a_kept_one_the_read_needs() {
        let mut blocks = Blocks::default();
        // A full cache, block 1 the least recently used.
        for block in 1..=BLOCKS_KEPT as u64 {
            blocks.keep(block, Bytes::from_static(b"kept"));
        }
        let mut asked = None;
        blocks
            .ensure(0..=1, |range| {
                asked = Some(range.clone());
                Ok(Bytes::from(vec![7u8; (range.end - range.start) as usize]))
            })
            .unwrap();
        assert_eq!(asked, Some(0..BLOCK), "only the missing block is fetched");
        assert_eq!(blocks.kept[&1].as_ref(), b"kept");
        assert_eq!(blocks.kept[&0].len(), BLOCK as usize);
        assert_eq!(blocks.kept.len(), BLOCKS_KEPT);
    }
}
