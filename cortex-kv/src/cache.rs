//! The block KV cache: fixed-size blocks, reference counts, prefix hashes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use cortex_request::{CacheScope, TokenId};

use crate::lru::Lru;

/// Index of a block in the pool.
pub type BlockId = u32;
/// Identifies a sequence (one stream of tokens with its own KV).
pub type SeqId = u64;

/// An invariant of the block accounting found broken by
/// [`KvCache::verify`], described (a bug in this crate, never the caller's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BrokenInvariant(pub String);

/// What the block accounting refuses to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// Not enough free or evictable blocks.
    #[error("out of KV blocks: {needed} needed, {available} free or evictable")]
    OutOfBlocks {
        /// Blocks the operation needed.
        needed: usize,
        /// Blocks that could be had.
        available: usize,
    },
    /// `allocate` or `fork` named a sequence that already holds blocks.
    #[error("sequence {0} already holds blocks")]
    SequenceExists(SeqId),
    /// The sequence holds no blocks.
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    /// `mark_computed` went past the sequence's tokens.
    #[error("sequence {seq} holds {held} tokens; {requested} cannot be computed")]
    BeyondSequence {
        /// The sequence.
        seq: SeqId,
        /// Tokens it holds.
        held: usize,
        /// Tokens claimed computed.
        requested: usize,
    },
    /// A pool with no blocks or blocks of no tokens.
    #[error("invalid KV configuration: {0}")]
    InvalidConfig(&'static str),
}

/// Result of [`KvCache::allocate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Leading prompt tokens whose KV already exists in the reused blocks.
    pub cached_tokens: usize,
    /// The reused blocks, in prompt order (block `i` holds tokens `i*B..(i+1)*B`).
    pub reused: Vec<BlockId>,
}

/// How much of a token sequence the cache could provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixProbe {
    /// Leading tokens whose KV is computed and reusable now.
    pub cached_tokens: usize,
    /// Leading tokens reusable once blocks other sequences are computing now
    /// are done (`>= cached_tokens`).
    pub pending_tokens: usize,
}

/// A snapshot of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KvStats {
    /// Blocks in the pool.
    pub total_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks held by at least one sequence.
    pub used_blocks: usize,
    /// Blocks held by more than one sequence.
    pub shared_blocks: usize,
    /// Blocks held by no sequence but kept for prefix reuse (evictable).
    pub cached_blocks: usize,
    /// Blocks on the free list.
    pub free_blocks: usize,
    /// `used_blocks / total_blocks`.
    pub utilisation: f64,
    /// Token slots in used blocks that hold no token.
    pub slack_tokens: usize,
    /// `slack_tokens` over the token slots of used blocks.
    pub fragmentation: f64,
    /// Cached blocks reclaimed for new data so far.
    pub evictions: u64,
    /// Prompt tokens served from cached or shared blocks so far.
    pub reused_tokens: u64,
}

#[derive(Debug, Clone, Default)]
struct Block {
    /// Sequences whose table holds this block.
    refs: u32,
    /// Token slots written.
    fill: u32,
    /// Content key (hash chain) while the block is in the index or the pending index.
    key: Option<u64>,
    /// In the index of computed blocks.
    indexed: bool,
    /// Content and parent key, kept while keyed so lookups verify instead of trusting the hash.
    tokens: Vec<TokenId>,
    parent: u64,
}

#[derive(Debug, Clone)]
struct Sequence {
    blocks: Vec<BlockId>,
    tokens: Vec<TokenId>,
    computed: usize,
    /// Chain key of each full block of `tokens`, filled as blocks fill.
    keys: Vec<u64>,
    /// The parent key of its first block: its cache scope's root.
    root: u64,
}

const ROOT_KEY: u64 = 0x6b76_5f72_6f6f_7421;

/// The key every chain of `scope` starts from: chains of two scopes share
/// no block, since a block's parent key is part of what a lookup verifies.
fn root_key(scope: CacheScope) -> u64 {
    if scope.is_shared() {
        ROOT_KEY
    } else {
        let mut hasher = DefaultHasher::new();
        (ROOT_KEY, scope.0).hash(&mut hasher);
        hasher.finish()
    }
}

fn chain_key(parent: u64, tokens: &[TokenId]) -> u64 {
    let mut hasher = DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

/// Block accounting for a KV cache: a fixed pool of `B`-token blocks, with no
/// tensors.
///
/// * Allocation and release are O(1) per block (a free list).
/// * Each sequence has a block table; block `i` holds its tokens `i*B..(i+1)*B`.
/// * Full blocks are shared between sequences with the same prefix, reference
///   counted; a block is never on the free list while referenced.
/// * Computed full blocks enter a prefix index keyed by a hash chain over their
///   contents (verified against the stored tokens, so a hash collision never
///   shares wrong KV). When no sequence holds them any more they stay as an
///   evictable cache, least recently released first out; deeper blocks of a
///   sequence are released before shallower ones, so a prefix outlives its
///   extensions.
/// * Blocks of prompts being computed are in a pending index, so a scheduler
///   can wait for a prefix that is about to exist instead of computing it twice.
#[derive(Debug, Clone)]
pub struct KvCache {
    block_size: usize,
    blocks: Vec<Block>,
    free: Vec<BlockId>,
    cached: Lru,
    index: HashMap<u64, BlockId>,
    pending: HashMap<u64, BlockId>,
    seqs: HashMap<SeqId, Sequence>,
    evicted: Vec<BlockId>,
    evictions: u64,
    reused_tokens: u64,
    prefix_caching: bool,
}

/// Where a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// On the free list.
    Free,
    /// Held by at least one sequence.
    Used,
    /// Held by no sequence, kept in the prefix index until evicted.
    Cached,
}

impl KvCache {
    /// A pool of `num_blocks` blocks of `block_size` tokens each.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        if num_blocks == 0 {
            return Err(KvError::InvalidConfig("the pool needs at least one block"));
        }
        if block_size == 0 {
            return Err(KvError::InvalidConfig("blocks need at least one token"));
        }
        if num_blocks >= u32::MAX as usize {
            return Err(KvError::InvalidConfig("too many blocks"));
        }
        Ok(Self {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            // Reversed so that block 0 is handed out first.
            free: (0..num_blocks as BlockId).rev().collect(),
            cached: Lru::new(num_blocks),
            index: HashMap::new(),
            pending: HashMap::new(),
            seqs: HashMap::new(),
            evicted: Vec::new(),
            evictions: 0,
            reused_tokens: 0,
            prefix_caching: true,
        })
    }

    /// Switches prefix reuse on or off. Off, nothing is indexed or reused:
    /// every sequence computes all its tokens (for comparisons and debugging).
    pub fn set_prefix_caching(&mut self, enabled: bool) {
        self.prefix_caching = enabled;
    }

    /// Where `block` is, or `None` for an id outside the pool.
    pub fn block_state(&self, block: BlockId) -> Option<BlockState> {
        let b = self.blocks.get(block as usize)?;
        Some(if b.refs > 0 {
            BlockState::Used
        } else if self.cached.contains(block) {
            BlockState::Cached
        } else {
            BlockState::Free
        })
    }

    /// Evicts a cached block now (an engine reclaiming the memory behind it).
    /// Returns false, changing nothing, unless the block is cached.
    pub fn evict(&mut self, block: BlockId) -> bool {
        if self.block_state(block) != Some(BlockState::Cached) {
            return false;
        }
        self.cached.remove(block);
        self.drop_from_index(block);
        self.evictions += 1;
        self.free.push(block);
        true
    }

    fn drop_from_index(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        let key = block.key.take().expect("cached blocks are indexed");
        block.indexed = false;
        block.tokens = Vec::new();
        block.fill = 0;
        self.index.remove(&key);
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now: free plus evictable cached ones.
    pub fn available_blocks(&self) -> usize {
        self.free.len() + self.cached.len()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether any computed block is indexed (so a prefix lookup can hit).
    pub fn has_cached_prefixes(&self) -> bool {
        !self.index.is_empty()
    }

    /// Whether `seq` holds blocks.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The block table of `seq`.
    pub fn blocks_of(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }

    /// Tokens `seq` holds slots for, and how many of them are computed.
    pub fn tokens_of(&self, seq: SeqId) -> Option<(usize, usize)> {
        self.seqs.get(&seq).map(|s| (s.tokens.len(), s.computed))
    }

    /// How many leading full blocks of `tokens` `allocate` would reuse: the
    /// computed ones, leaving at least the last token to compute (its logits are
    /// needed), and the blocks among them that would leave the evictable cache.
    fn reusable(&self, root: u64, tokens: &[TokenId]) -> (Vec<BlockId>, usize) {
        let max_blocks = if self.prefix_caching {
            tokens.len().saturating_sub(1) / self.block_size
        } else {
            0
        };
        let mut parent = root;
        let mut reused = Vec::new();
        let mut from_cache = 0;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let key = chain_key(parent, chunk);
            match self.index.get(&key) {
                Some(&id) if self.holds(id, parent, chunk) => {
                    reused.push(id);
                    from_cache += usize::from(self.cached.contains(id));
                }
                _ => break,
            }
            parent = key;
        }
        (reused, from_cache)
    }

    fn holds(&self, id: BlockId, parent: u64, tokens: &[TokenId]) -> bool {
        let block = &self.blocks[id as usize];
        block.parent == parent && block.tokens == tokens
    }

    /// How much of `tokens` is cached now, and how much will be once blocks
    /// being computed for other sequences are done. Read-only.
    pub fn probe(&self, tokens: &[TokenId]) -> PrefixProbe {
        self.probe_in(CacheScope::SHARED, tokens)
    }

    /// [`KvCache::probe`] among the blocks of `scope` only.
    pub fn probe_in(&self, scope: CacheScope, tokens: &[TokenId]) -> PrefixProbe {
        let max_blocks = tokens.len().saturating_sub(1) / self.block_size;
        let mut parent = root_key(scope);
        let mut probe = PrefixProbe::default();
        let mut only_pending = false;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let key = chain_key(parent, chunk);
            let computed = self
                .index
                .get(&key)
                .filter(|&&id| self.holds(id, parent, chunk));
            let pending = self
                .pending
                .get(&key)
                .filter(|&&id| self.holds(id, parent, chunk));
            match (computed, pending) {
                (Some(_), _) if !only_pending => probe.cached_tokens += self.block_size,
                (Some(_), _) | (None, Some(_)) => only_pending = true,
                (None, None) => break,
            }
            probe.pending_tokens += self.block_size;
            parent = key;
        }
        probe
    }

    /// Blocks `allocate(tokens)` would take from the free list or the cache.
    pub fn blocks_needed(&self, tokens: &[TokenId]) -> usize {
        self.blocks_needed_in(CacheScope::SHARED, tokens)
    }

    /// [`KvCache::blocks_needed`] for a sequence of `scope`.
    pub fn blocks_needed_in(&self, scope: CacheScope, tokens: &[TokenId]) -> usize {
        let (reused, from_cache) = self.reusable(root_key(scope), tokens);
        self.blocks_for(tokens.len()) - reused.len() + from_cache
    }

    /// Gives `seq` blocks for `tokens`, reusing the longest computed prefix of
    /// full blocks (always leaving the last token to compute). All or nothing:
    /// on error nothing changes.
    pub fn allocate(&mut self, seq: SeqId, tokens: &[TokenId]) -> Result<Allocation, KvError> {
        self.allocate_in(seq, CacheScope::SHARED, tokens)
    }

    /// [`KvCache::allocate`] in `scope`: only blocks computed for sequences
    /// of the same scope are reused, and this one's blocks serve only them.
    pub fn allocate_in(
        &mut self,
        seq: SeqId,
        scope: CacheScope,
        tokens: &[TokenId],
    ) -> Result<Allocation, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        let root = root_key(scope);
        let (reused, from_cache) = self.reusable(root, tokens);
        let fresh = self.blocks_for(tokens.len()) - reused.len();
        let available = self.available_blocks() - from_cache;
        if fresh > available {
            return Err(KvError::OutOfBlocks {
                needed: fresh,
                available,
            });
        }
        for &id in &reused {
            if self.cached.contains(id) {
                self.cached.remove(id);
            }
            self.blocks[id as usize].refs += 1;
        }
        let mut blocks = reused.clone();
        for i in reused.len()..self.blocks_for(tokens.len()) {
            let id = self.take_block();
            let fill = (tokens.len() - i * self.block_size).min(self.block_size);
            self.blocks[id as usize].fill = fill as u32;
            blocks.push(id);
        }
        let cached_tokens = reused.len() * self.block_size;
        self.reused_tokens += cached_tokens as u64;
        let mut sequence = Sequence {
            blocks,
            tokens: tokens.to_vec(),
            computed: cached_tokens,
            keys: Vec::new(),
            root,
        };
        self.extend_keys(&mut sequence);
        // Full blocks still to compute become pending, so others can wait for them.
        let pending_blocks = if self.prefix_caching {
            sequence.keys.len()
        } else {
            0
        };
        for i in reused.len()..pending_blocks {
            let id = sequence.blocks[i];
            let key = sequence.keys[i];
            if let std::collections::hash_map::Entry::Vacant(slot) = self.pending.entry(key) {
                slot.insert(id);
                let parent = if i == 0 {
                    sequence.root
                } else {
                    sequence.keys[i - 1]
                };
                let range = i * self.block_size..(i + 1) * self.block_size;
                let block = &mut self.blocks[id as usize];
                block.key = Some(key);
                block.parent = parent;
                block.tokens = sequence.tokens[range].to_vec();
            }
        }
        self.seqs.insert(seq, sequence);
        Ok(Allocation {
            cached_tokens,
            reused,
        })
    }

    /// Computes the chain keys of full blocks not keyed yet.
    fn extend_keys(&self, sequence: &mut Sequence) {
        let full = sequence.tokens.len() / self.block_size;
        while sequence.keys.len() < full {
            let i = sequence.keys.len();
            let parent = sequence.keys.last().copied().unwrap_or(sequence.root);
            let chunk = &sequence.tokens[i * self.block_size..(i + 1) * self.block_size];
            sequence.keys.push(chain_key(parent, chunk));
        }
    }

    /// Reserves a slot for one more token of `seq` (the token a decode step
    /// feeds), taking a new block when the last one is full.
    pub fn append(&mut self, seq: SeqId, token: TokenId) -> Result<(), KvError> {
        let block_size = self.block_size;
        let needs_block = {
            let s = self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
            s.tokens.len() % block_size == 0
        };
        let new_block = if needs_block {
            if self.available_blocks() == 0 {
                return Err(KvError::OutOfBlocks {
                    needed: 1,
                    available: 0,
                });
            }
            Some(self.take_block())
        } else {
            None
        };
        let s = self.seqs.get_mut(&seq).expect("checked above");
        if let Some(id) = new_block {
            s.blocks.push(id);
        }
        s.tokens.push(token);
        let last = *s.blocks.last().expect("a sequence with tokens has blocks");
        self.blocks[last as usize].fill += 1;
        Ok(())
    }

    /// Gives `child` the same tokens as `parent`: full blocks are shared, a
    /// partial last block is copied into a block of the child's own (so the two
    /// can grow apart).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::SequenceExists(child));
        }
        let source = self
            .seqs
            .get(&parent)
            .ok_or(KvError::UnknownSequence(parent))?;
        let partial = source.tokens.len() % self.block_size != 0;
        if partial && self.available_blocks() == 0 {
            return Err(KvError::OutOfBlocks {
                needed: 1,
                available: 0,
            });
        }
        let mut sequence = source.clone();
        if partial {
            let shared_full = sequence.blocks.len() - 1;
            let id = self.take_block();
            self.blocks[id as usize].fill = (sequence.tokens.len() % self.block_size) as u32;
            sequence.blocks[shared_full] = id;
        }
        for &id in &sequence.blocks[..sequence.tokens.len() / self.block_size] {
            self.blocks[id as usize].refs += 1;
        }
        self.reused_tokens += (sequence.tokens.len() / self.block_size * self.block_size) as u64;
        self.seqs.insert(child, sequence);
        Ok(())
    }

    /// Records that the first `computed` tokens of `seq` now have KV; full
    /// blocks among them enter the prefix index.
    pub fn mark_computed(&mut self, seq: SeqId, computed: usize) -> Result<(), KvError> {
        let mut s = self
            .seqs
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if computed > s.tokens.len() {
            let held = s.tokens.len();
            self.seqs.insert(seq, s);
            return Err(KvError::BeyondSequence {
                seq,
                held,
                requested: computed,
            });
        }
        let before = s.computed / self.block_size;
        s.computed = s.computed.max(computed);
        self.extend_keys(&mut s);
        for i in before..s.computed / self.block_size {
            let parent = if i == 0 { s.root } else { s.keys[i - 1] };
            let range = i * self.block_size..(i + 1) * self.block_size;
            self.publish(s.blocks[i], s.keys[i], parent, &s.tokens[range]);
        }
        self.seqs.insert(seq, s);
        Ok(())
    }

    /// Moves a computed full block into the index (unless an equal block is there).
    fn publish(&mut self, id: BlockId, key: u64, parent: u64, tokens: &[TokenId]) {
        if self.blocks[id as usize].indexed || !self.prefix_caching {
            return;
        }
        self.unpend(id);
        if self.index.contains_key(&key) {
            return;
        }
        self.index.insert(key, id);
        let block = &mut self.blocks[id as usize];
        block.key = Some(key);
        block.indexed = true;
        block.parent = parent;
        block.tokens = tokens.to_vec();
    }

    /// Takes the block out of the pending index, if it is there.
    fn unpend(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        if let Some(key) = block.key.filter(|_| !block.indexed) {
            if self.pending.get(&key) == Some(&id) {
                self.pending.remove(&key);
            }
            block.key = None;
            block.tokens = Vec::new();
        }
    }

    /// How many blocks would become available if `seq` were freed: those it
    /// holds alone (0 for an unknown sequence).
    pub fn blocks_freed_by(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| {
            s.blocks
                .iter()
                .filter(|&&id| self.blocks[id as usize].refs == 1)
                .count()
        })
    }

    /// Releases `seq`'s blocks: computed full blocks stay as evictable cache,
    /// the rest return to the free list. Returns how many blocks it held.
    pub fn free(&mut self, seq: SeqId) -> Result<usize, KvError> {
        let s = self
            .seqs
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        // Deepest first, so a prefix is evicted after the blocks that extend it.
        for &id in s.blocks.iter().rev() {
            let block = &mut self.blocks[id as usize];
            block.refs -= 1;
            if block.refs > 0 {
                continue;
            }
            if block.indexed {
                self.cached.push_back(id);
            } else {
                self.unpend(id);
                self.blocks[id as usize].fill = 0;
                self.free.push(id);
            }
        }
        Ok(s.blocks.len())
    }

    /// A block from the free list, or else the least recently released cached one.
    fn take_block(&mut self) -> BlockId {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = self
                    .cached
                    .pop_oldest()
                    .expect("callers check availability");
                let block = &mut self.blocks[id as usize];
                let key = block.key.take().expect("cached blocks are indexed");
                block.indexed = false;
                block.tokens = Vec::new();
                self.index.remove(&key);
                self.evicted.push(id);
                self.evictions += 1;
                id
            }
        };
        let block = &mut self.blocks[id as usize];
        block.refs = 1;
        block.fill = 0;
        id
    }

    /// Cached blocks evicted since the last call (an engine drops their KV).
    pub fn drain_evicted(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.evicted)
    }

    /// A snapshot of the pool.
    pub fn stats(&self) -> KvStats {
        let mut stats = KvStats {
            total_blocks: self.blocks.len(),
            block_size: self.block_size,
            cached_blocks: self.cached.len(),
            free_blocks: self.free.len(),
            evictions: self.evictions,
            reused_tokens: self.reused_tokens,
            ..KvStats::default()
        };
        for block in self.blocks.iter().filter(|b| b.refs > 0) {
            stats.used_blocks += 1;
            stats.shared_blocks += usize::from(block.refs > 1);
            stats.slack_tokens += self.block_size - block.fill as usize;
        }
        stats.utilisation = stats.used_blocks as f64 / stats.total_blocks as f64;
        let slots = stats.used_blocks * self.block_size;
        stats.fragmentation = if slots == 0 {
            0.0
        } else {
            stats.slack_tokens as f64 / slots as f64
        };
        stats
    }

    /// Checks every internal invariant, describing the first one broken.
    /// Meant for tests and debugging; it walks the whole pool.
    pub fn verify(&self) -> Result<(), BrokenInvariant> {
        self.first_broken_invariant().map_err(BrokenInvariant)
    }

    fn first_broken_invariant(&self) -> Result<(), String> {
        let total = self.blocks.len();
        let mut refs = vec![0u32; total];
        for (seq, s) in &self.seqs {
            if s.blocks.len() != self.blocks_for(s.tokens.len()) {
                return Err(format!(
                    "sequence {seq}: {} blocks for {} tokens",
                    s.blocks.len(),
                    s.tokens.len()
                ));
            }
            for &id in &s.blocks {
                refs[id as usize] += 1;
            }
        }
        let mut on_free = vec![false; total];
        for &id in &self.free {
            if std::mem::replace(&mut on_free[id as usize], true) {
                return Err(format!("block {id} is on the free list twice"));
            }
        }
        for (id, block) in self.blocks.iter().enumerate() {
            let in_cache = self.cached.contains(id as BlockId);
            if block.refs != refs[id] {
                return Err(format!(
                    "block {id}: refcount {} but {} holders",
                    block.refs, refs[id]
                ));
            }
            let places =
                usize::from(block.refs > 0) + usize::from(on_free[id]) + usize::from(in_cache);
            if places != 1 {
                return Err(format!("block {id} is in {places} of used/free/cached"));
            }
            if in_cache && !block.indexed {
                return Err(format!("cached block {id} is not indexed"));
            }
        }
        for (key, &id) in &self.index {
            let block = &self.blocks[id as usize];
            if !block.indexed || block.key != Some(*key) || on_free[id as usize] {
                return Err(format!("index entry for block {id} is stale"));
            }
        }
        for (key, &id) in &self.pending {
            let block = &self.blocks[id as usize];
            if block.indexed || block.key != Some(*key) || block.refs == 0 {
                return Err(format!("pending entry for block {id} is stale"));
            }
        }
        if self.cached.iter().count() != self.cached.len() {
            return Err("the cache list's length is wrong".into());
        }
        Ok(())
    }
}
