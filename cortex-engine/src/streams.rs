//! KV binding: which executor stream each running sequence computes in, and
//! which cached prefix blocks each stream holds.
//!
//! Every sequence runs in a stream of its own (llama.cpp's non-unified KV), so
//! a token's attention reads only its own sequence's cells and large batches
//! do not collapse. The block accounting of `cortex-kv` still decides what is
//! shared: when a sequence is admitted reusing `k` cached blocks, it either
//! *takes over* a stream that holds them and runs nothing (no copy at all), or
//! gets a free stream filled by a whole-stream copy from a holder, cut back to
//! the `k` shared blocks. A finished sequence's stream stays *retired* while it
//! is the only holder of blocks the accounting keeps as prefix cache.
//!
//! Invariants ([`Streams::verify`]):
//! - every stream is exactly one of free (holds nothing), running (one
//!   sequence) or retired (holds cached blocks, runs nothing);
//! - a stream's chain is the accounting blocks of depths `0..k` whose cells it
//!   holds (positions `0..k*B`), and `holders` lists exactly the streams whose
//!   chain contains each block; a block is at the same depth in every chain;
//! - a running stream's chain is a prefix of its sequence's block table and
//!   every block in a chain is live in the accounting (used or cached);
//! - every cached block of the accounting has a holder (so a reuse the
//!   scheduler plans always finds its cells), and a retired stream holds at
//!   least one block;
//! - `chain.len() * B <= len <= capacity`.

use std::collections::{BTreeSet, HashMap};

use cortex_kv::{BlockId, BlockState, KvCache};
use cortex_request::RequestId;

use crate::executor::{Executor, PrefixShare, StreamId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Free,
    Running(RequestId),
    /// Runs nothing; kept for its cached blocks. The number orders retirements.
    Retired(u64),
}

#[derive(Debug, Clone)]
struct Stream {
    role: Role,
    /// Accounting blocks whose cells this stream holds, by depth from 0.
    chain: Vec<BlockId>,
    /// Positions `0..len` have cells in the executor.
    len: usize,
}

/// How an admitted sequence got its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// A free stream, nothing reused.
    Fresh,
    /// A retired stream that held the reused prefix, taken over.
    TakenOver,
    /// A free stream filled with a copy of a holder of the reused prefix.
    Copied,
}

/// An admission to bind: the sequence and the cached blocks it reuses.
#[derive(Debug, Clone)]
pub(crate) struct ToBind {
    pub(crate) seq: RequestId,
    pub(crate) reused: Vec<BlockId>,
}

/// The stream of every running sequence and the blocks every stream holds.
#[derive(Debug)]
pub(crate) struct Streams {
    block_size: usize,
    capacity: usize,
    streams: Vec<Stream>,
    /// Free streams; the lowest id is handed out first, so running streams
    /// stay contiguous and llama.cpp decodes them in one micro-batch.
    free: BTreeSet<StreamId>,
    holders: HashMap<BlockId, Vec<StreamId>>,
    retirements: u64,
}

impl Streams {
    pub(crate) fn new(streams: usize, capacity: usize, block_size: usize) -> Self {
        Self {
            block_size,
            capacity,
            streams: vec![
                Stream {
                    role: Role::Free,
                    chain: Vec::new(),
                    len: 0,
                };
                streams
            ],
            free: (0..streams as StreamId).collect(),
            holders: HashMap::new(),
            retirements: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn count(&self) -> usize {
        self.streams.len()
    }

    fn stream(&self, id: StreamId) -> &Stream {
        &self.streams[id as usize]
    }

    fn stream_mut(&mut self, id: StreamId) -> &mut Stream {
        &mut self.streams[id as usize]
    }

    /// Binds admitted sequences to streams. Deepest reuse first, so a retired
    /// holder is taken over by the sequence that needs most of it; copies are
    /// issued before any retired stream is reclaimed, so every source still
    /// holds its cells (llama.cpp copies buffers at the next decode, before it
    /// writes anything). Returns each sequence's stream and how it got it; the
    /// cached blocks that lost their last holder go to `orphans` (the caller
    /// evicts them from the accounting).
    pub(crate) fn bind_all(
        &mut self,
        mut admissions: Vec<ToBind>,
        kv: &KvCache,
        executor: &mut dyn Executor,
        orphans: &mut Vec<BlockId>,
    ) -> Vec<(RequestId, StreamId, Binding)> {
        admissions.sort_by_key(|a| std::cmp::Reverse(a.reused.len()));
        let mut bound = Vec::with_capacity(admissions.len());
        let mut later = Vec::new();
        let mut unbound = admissions.len();
        let mut last_free = None;
        for admission in admissions {
            unbound -= 1;
            if admission.reused.is_empty() {
                later.push(admission);
            } else if let Some(stream) = self.take_over(&admission, false, kv, executor, orphans) {
                bound.push((admission.seq, stream, Binding::TakenOver));
            } else if let Some(stream) = self.take_free(unbound + later.len() + 1, &mut last_free) {
                self.copy_into(stream, &admission, executor);
                bound.push((admission.seq, stream, Binding::Copied));
            } else if let Some(stream) = self.take_over(&admission, true, kv, executor, orphans) {
                bound.push((admission.seq, stream, Binding::TakenOver));
            } else {
                later.push(admission);
            }
        }
        let mut unbound = later.len();
        for admission in later {
            unbound -= 1;
            let stream = match self.take_free(unbound + 1, &mut last_free) {
                Some(stream) => stream,
                None => self.reclaim(kv, executor, orphans),
            };
            if admission.reused.is_empty() {
                self.stream_mut(stream).role = Role::Running(admission.seq);
                bound.push((admission.seq, stream, Binding::Fresh));
            } else {
                self.copy_into(stream, &admission, executor);
                bound.push((admission.seq, stream, Binding::Copied));
            }
        }
        bound
    }

    /// A free stream for one of `wanted` sequences bound in one step: the
    /// one after the last it took (`last`) when that is free, else the
    /// first of a run of free streams that holds them all, else of the
    /// longest run. Sequences admitted together sit side by side, so their
    /// prompt chunks fall in one of llama.cpp's micro-batches (it splits a
    /// batch at every gap between stream ids).
    fn take_free(&mut self, wanted: usize, last: &mut Option<StreamId>) -> Option<StreamId> {
        let next = last.map(|l| l + 1).filter(|n| self.free.contains(n));
        let stream = next.or_else(|| {
            // The free set is ordered: a run continues while ids follow on.
            let mut longest: Option<(usize, StreamId)> = None;
            let (mut start, mut len) = (0, 0);
            let mut previous: Option<StreamId> = None;
            for &id in &self.free {
                if previous.is_some_and(|p| id == p + 1) {
                    len += 1;
                } else {
                    (start, len) = (id, 1);
                }
                previous = Some(id);
                if len >= wanted {
                    return Some(start);
                }
                if longest.is_none_or(|(most, _)| len > most) {
                    longest = Some((len, start));
                }
            }
            longest.map(|(_, start)| start)
        })?;
        self.free.remove(&stream);
        *last = Some(stream);
        Some(stream)
    }

    /// Takes over a retired stream holding the admission's prefix, when what
    /// it holds beyond that prefix is held elsewhere too or no longer live;
    /// when `lossy`, also when that loses cached blocks (which beats
    /// reclaiming a stream and copying into it), as long as no admission of
    /// this step needs them.
    fn take_over(
        &mut self,
        admission: &ToBind,
        lossy: bool,
        kv: &KvCache,
        executor: &mut dyn Executor,
        orphans: &mut Vec<BlockId>,
    ) -> Option<StreamId> {
        let k = admission.reused.len();
        let deepest = admission.reused[k - 1];
        let spare = |b: BlockId| {
            let state = kv.block_state(b);
            let gone_or_elsewhere = !matches!(state, Some(BlockState::Used | BlockState::Cached))
                || self.holders[&b].len() > 1;
            gone_or_elsewhere || (lossy && state == Some(BlockState::Cached))
        };
        let candidate = self.holders.get(&deepest)?.iter().copied().find(|&h| {
            matches!(self.stream(h).role, Role::Retired(_))
                && self.stream(h).chain[k..].iter().all(|&b| spare(b))
        })?;
        self.truncate_cells(candidate, k * self.block_size, executor);
        orphans.extend(self.set_chain(candidate, &admission.reused));
        self.stream_mut(candidate).role = Role::Running(admission.seq);
        Some(candidate)
    }

    /// Fills free stream `stream` with a holder's copy of the admission's prefix.
    fn copy_into(&mut self, stream: StreamId, admission: &ToBind, executor: &mut dyn Executor) {
        let k = admission.reused.len();
        let source = self.holders[&admission.reused[k - 1]][0];
        executor.copy_stream(source, stream);
        executor.truncate_stream(stream, k * self.block_size);
        let orphans = self.set_chain(stream, &admission.reused);
        debug_assert!(orphans.is_empty(), "a free stream holds nothing");
        let len = k * self.block_size;
        let target = self.stream_mut(stream);
        target.role = Role::Running(admission.seq);
        target.len = len;
    }

    /// Frees the oldest retired stream that no unbound admission needs (no
    /// block only it holds is in use), for a new sequence.
    fn reclaim(
        &mut self,
        kv: &KvCache,
        executor: &mut dyn Executor,
        orphans: &mut Vec<BlockId>,
    ) -> StreamId {
        let victim = (0..self.streams.len() as StreamId)
            .filter_map(|id| match self.stream(id).role {
                Role::Retired(order) => Some((order, id)),
                _ => None,
            })
            .filter(|&(_, id)| {
                self.stream(id).chain.iter().all(|&b| {
                    kv.block_state(b) != Some(BlockState::Used) || self.holders[&b].len() > 1
                })
            })
            .min()
            .map(|(_, id)| id)
            .expect("the scheduler admits no more sequences than there are streams");
        orphans.extend(self.set_chain(victim, &[]));
        self.truncate_cells(victim, 0, executor);
        self.stream_mut(victim).role = Role::Free;
        victim
    }

    /// Makes `stream`'s chain exactly `blocks` (the same content: a block id
    /// differs only where two sequences computed equal blocks side by side).
    /// Returns blocks that lost their last holder.
    fn set_chain(&mut self, stream: StreamId, blocks: &[BlockId]) -> Vec<BlockId> {
        let old = std::mem::replace(&mut self.stream_mut(stream).chain, blocks.to_vec());
        let mut orphans = Vec::new();
        for (depth, &block) in blocks.iter().enumerate() {
            match old.get(depth) {
                Some(&same) if same == block => continue,
                Some(&other) => orphans.extend(self.unhold(other, stream)),
                None => {}
            }
            self.holders.entry(block).or_default().push(stream);
        }
        for &deeper in old.iter().skip(blocks.len()) {
            orphans.extend(self.unhold(deeper, stream));
        }
        orphans
    }

    /// `stream` no longer holds `block`; returns it when nothing holds it now.
    fn unhold(&mut self, block: BlockId, stream: StreamId) -> Option<BlockId> {
        let holders = self.holders.get_mut(&block).expect("chains are indexed");
        holders.retain(|&h| h != stream);
        if holders.is_empty() {
            self.holders.remove(&block);
            Some(block)
        } else {
            None
        }
    }

    /// Drops `stream`'s cells from `from` on, in the executor too.
    fn truncate_cells(&mut self, stream: StreamId, from: usize, executor: &mut dyn Executor) {
        let s = self.stream_mut(stream);
        if s.len > from {
            s.len = from;
            executor.truncate_stream(stream, from);
        }
    }

    /// Cuts `stream`'s chain to `keep` blocks and its cells to match.
    fn cut(&mut self, stream: StreamId, keep: usize) -> Vec<BlockId> {
        let chain = &self.stream(stream).chain;
        let kept = chain[..keep.min(chain.len())].to_vec();
        self.set_chain(stream, &kept)
    }

    /// Records what a running stream has computed: `computed` positions, and
    /// the full blocks among them from its sequence's block table.
    pub(crate) fn computed(&mut self, stream: StreamId, table: &[BlockId], computed: usize) {
        let full = (computed / self.block_size).min(table.len());
        let s = &mut self.streams[stream as usize];
        s.len = s.len.max(computed);
        let start = s.chain.len();
        if full > start {
            s.chain.extend_from_slice(&table[start..full]);
            for &block in &table[start..full] {
                self.holders.entry(block).or_default().push(stream);
            }
        }
    }

    /// The sequence in `stream` left it (finished, failed, cancelled or
    /// preempted), after the accounting released its blocks. The stream keeps
    /// the longest prefix of live blocks and is retired when one of them is
    /// held nowhere else; otherwise it is freed. Blocks that lost their last
    /// holder go to `orphans`.
    pub(crate) fn release(
        &mut self,
        stream: StreamId,
        kv: &KvCache,
        executor: &mut dyn Executor,
        orphans: &mut Vec<BlockId>,
    ) {
        let chain = &self.stream(stream).chain;
        let live = chain.iter().take_while(|&&b| is_live(kv, b)).count();
        let unique = chain[..live].iter().any(|b| self.holders[b].len() == 1);
        orphans.extend(self.cut(stream, if unique { live } else { 0 }));
        if unique {
            self.truncate_cells(stream, live * self.block_size, executor);
            self.retirements += 1;
            self.stream_mut(stream).role = Role::Retired(self.retirements);
        } else {
            self.free_stream(stream, executor);
        }
    }

    /// The accounting evicted a cached block: every holder loses it and all
    /// deeper blocks. Deeper blocks that lost their last holder go to `orphans`.
    pub(crate) fn evicted(
        &mut self,
        block: BlockId,
        executor: &mut dyn Executor,
        orphans: &mut Vec<BlockId>,
    ) {
        let Some(holders) = self.holders.get(&block).cloned() else {
            return;
        };
        for stream in holders {
            let depth = self
                .stream(stream)
                .chain
                .iter()
                .position(|&b| b == block)
                .expect("holders hold their blocks");
            orphans.extend(self.cut(stream, depth).into_iter().filter(|&b| b != block));
            if self.stream(stream).chain.is_empty()
                && matches!(self.stream(stream).role, Role::Retired(_))
            {
                self.free_stream(stream, executor);
            } else {
                self.truncate_cells(stream, depth * self.block_size, executor);
            }
        }
    }

    /// Of `streams`, those whose first blocks another stream holds too (a
    /// copy of a shared prompt prefix): with the lowest id among the holders
    /// of their deepest such block, and its cells. Streams that share a
    /// block share every block before it, so the holders of a block hold
    /// the same bytes up to its end.
    pub(crate) fn shared_prefixes(&self, streams: &[StreamId]) -> Vec<PrefixShare> {
        let held = |block: &BlockId| self.holders.get(block).map_or(0, Vec::len);
        streams
            .iter()
            .filter_map(|&stream| {
                let chain = &self.stream(stream).chain;
                // Holders only fall with depth: the deepest shared block is
                // the last of the run held twice or more.
                let depth = chain.partition_point(|b| held(b) >= 2);
                let deepest = chain.get(depth.checked_sub(1)?)?;
                let source = *self.holders[deepest].iter().min()?;
                Some(PrefixShare {
                    stream,
                    source,
                    cells: depth * self.block_size,
                })
            })
            .collect()
    }

    /// The position at which `stream` can take a throwaway token (see
    /// [`crate::EngineConfig::gap_fill`]): where its cells end, unless it is
    /// full.
    pub(crate) fn filler_position(&self, stream: StreamId) -> Option<usize> {
        let len = self.stream(stream).len;
        (len < self.capacity).then_some(len)
    }

    /// Drops whatever a decode wrote to `stream` from `from` on that this
    /// module never recorded (a failed decode's, a throwaway token's).
    pub(crate) fn truncate(&mut self, stream: StreamId, from: usize, executor: &mut dyn Executor) {
        let orphans = self.cut(stream, from / self.block_size);
        debug_assert!(orphans.is_empty(), "only uncomputed positions fail");
        let s = self.stream_mut(stream);
        s.len = s.len.min(from);
        executor.truncate_stream(stream, from);
    }

    fn free_stream(&mut self, stream: StreamId, executor: &mut dyn Executor) {
        debug_assert!(self.stream(stream).chain.is_empty());
        self.truncate_cells(stream, 0, executor);
        self.stream_mut(stream).role = Role::Free;
        self.free.insert(stream);
    }

    /// Retired streams (holding prefix cache).
    pub(crate) fn retired(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| matches!(s.role, Role::Retired(_)))
            .count()
    }

    /// Checks every invariant in the module docs against the accounting;
    /// `table` gives a running sequence's block table.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub(crate) fn verify<'k>(
        &self,
        kv: &'k KvCache,
        table: impl Fn(RequestId) -> Option<&'k [BlockId]>,
    ) -> Result<(), String> {
        let mut depth_of: HashMap<BlockId, usize> = HashMap::new();
        let mut held: HashMap<BlockId, Vec<StreamId>> = HashMap::new();
        for (id, s) in self.streams.iter().enumerate() {
            let id = id as StreamId;
            if (s.role == Role::Free) != self.free.contains(&id) {
                return Err(format!(
                    "stream {id}: free list disagrees with {:?}",
                    s.role
                ));
            }
            if s.chain.len() * self.block_size > s.len || s.len > self.capacity {
                return Err(format!(
                    "stream {id}: {} blocks but {} cells (capacity {})",
                    s.chain.len(),
                    s.len,
                    self.capacity
                ));
            }
            match s.role {
                Role::Free if s.len > 0 => return Err(format!("free stream {id} holds cells")),
                Role::Running(seq) => {
                    let table = table(seq).ok_or(format!("stream {id}: {seq:?} not running"))?;
                    if !table.starts_with(&s.chain) {
                        return Err(format!("stream {id}: chain is not {seq:?}'s prefix"));
                    }
                }
                _ => {}
            }
            for (depth, &block) in s.chain.iter().enumerate() {
                if !is_live(kv, block) {
                    return Err(format!("stream {id}: block {block} is not live"));
                }
                if *depth_of.entry(block).or_insert(depth) != depth {
                    return Err(format!("block {block} at two depths"));
                }
                held.entry(block).or_default().push(id);
            }
        }
        for (block, streams) in &held {
            let mut recorded = self.holders.get(block).cloned().unwrap_or_default();
            recorded.sort_unstable();
            if &recorded != streams {
                return Err(format!(
                    "block {block}: holders {recorded:?}, chains {streams:?}"
                ));
            }
        }
        if self.holders.len() != held.len() {
            return Err("holders names blocks no chain holds".into());
        }
        for block in 0..kv.total_blocks() as BlockId {
            if kv.block_state(block) == Some(BlockState::Cached) && !held.contains_key(&block) {
                return Err(format!("cached block {block} has no cells anywhere"));
            }
        }
        for (id, s) in self.streams.iter().enumerate() {
            if matches!(s.role, Role::Retired(_)) && s.chain.is_empty() {
                return Err(format!("retired stream {id} holds no block"));
            }
        }
        Ok(())
    }
}

fn is_live(kv: &KvCache, block: BlockId) -> bool {
    matches!(
        kv.block_state(block),
        Some(BlockState::Used | BlockState::Cached)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_bound_together_take_free_streams_side_by_side() {
        let mut streams = Streams::new(10, 64, 16);
        streams.free = [0, 1, 5, 6, 7, 9].into_iter().collect();
        let mut take = |wanted: usize, last: &mut Option<StreamId>| {
            streams.take_free(wanted, last).expect("a stream is free")
        };
        // Three go to the first run that holds them all, side by side.
        let mut last = None;
        assert_eq!([3, 2, 1].map(|left| take(left, &mut last)), [5, 6, 7]);
        // Two more: 8 is not free, so the first run that holds both.
        let mut last = None;
        assert_eq!([2, 1].map(|left| take(left, &mut last)), [0, 1]);
        assert_eq!(take(1, &mut last), 9);
        assert!(streams.take_free(1, &mut last).is_none());
        // More than any run holds: the longest run first.
        streams.free = [0, 1, 5, 6, 7, 9].into_iter().collect();
        assert_eq!(streams.take_free(4, &mut None), Some(5));
    }

    #[test]
    fn streams_that_hold_copies_of_a_prefix_name_its_lowest_holder_and_its_cells() {
        let mut streams = Streams::new(6, 256, 16);
        // Stream 0 keeps a prefix of three blocks; 1 and 2 copied all of it,
        // 3 its first two; 4 and 5 share nothing.
        for (stream, chain) in [
            (0, vec![10, 11, 12]),
            (1, vec![10, 11, 12, 20]),
            (2, vec![10, 11, 12, 21]),
            (3, vec![10, 11, 30]),
            (4, vec![40]),
        ] {
            assert!(streams.set_chain(stream, &chain).is_empty());
        }
        let share = |stream, source, cells| PrefixShare {
            stream,
            source,
            cells,
        };
        assert_eq!(
            streams.shared_prefixes(&[1, 2, 3, 4, 5]),
            [share(1, 0, 48), share(2, 0, 48), share(3, 0, 32)]
        );
        // The lowest holder even when it is the stream itself.
        assert_eq!(streams.shared_prefixes(&[0]), [share(0, 0, 48)]);
    }
}
