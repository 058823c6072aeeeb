//! KV-cache block accounting, with no tensors.
//!
//! [`KvCache`] manages a fixed pool of blocks of `B` tokens by integer
//! [`BlockId`]: O(1) allocation and release through a free list, a block table
//! per sequence that grows as it decodes, reference-counted blocks shared by
//! sequences with a common prefix, and a prefix index (a verified hash chain
//! over full blocks) that finds the longest computed prefix of a token sequence.
//! Blocks of finished sequences stay in the index as an evictable LRU cache
//! until their space is needed. [`KvStats`] reports utilisation, sharing,
//! caching and fragmentation.
//!
//! An engine mirrors its real KV memory with this accounting; a scheduler asks
//! it whether a request fits. It does no I/O and spawns no threads.
//!
//! # Example
//!
//! ```
//! use cortex_kv::KvCache;
//!
//! let mut kv = KvCache::new(8, 4)?; // 8 blocks of 4 tokens
//! let prompt: Vec<u32> = (0..10).collect();
//! let first = kv.allocate(1, &prompt)?; // 3 blocks, nothing cached yet
//! assert_eq!(first.cached_tokens, 0);
//! kv.mark_computed(1, prompt.len())?; // prefill done: full blocks are indexed
//! kv.append(1, 10)?; // decode: a slot for one more token
//!
//! // A second prompt with the same first 8 tokens reuses two blocks.
//! let mut other = prompt[..8].to_vec();
//! other.extend([90, 91]);
//! let second = kv.allocate(2, &other)?;
//! assert_eq!(second.cached_tokens, 8);
//! assert_eq!(kv.stats().shared_blocks, 2);
//!
//! kv.free(1)?;
//! kv.free(2)?; // computed blocks stay cached until the space is needed
//! assert_eq!(kv.stats().cached_blocks, 2);
//! assert_eq!(kv.available_blocks(), 8);
//! kv.verify().unwrap();
//! # Ok::<(), cortex_kv::KvError>(())
//! ```
//!
//! # Design notes
//!
//! `KvCache` is block accounting with no tensors: a pool of `B`-token blocks, a
//! free list (O(1)), a block table per sequence (block `i` holds tokens
//! `i*B..(i+1)*B`), reference counts for blocks shared by sequences, and a prefix
//! index keyed by a hash chain over full blocks' contents (verified against the
//! stored tokens). Computed full blocks enter the index; when no sequence holds
//! them they stay as an evictable LRU cache, deepest blocks first out. Blocks of
//! prompts still being computed sit in a pending index, so the scheduler can wait
//! for a prefix instead of computing it twice. `verify()` checks every invariant
//! (used by the property tests).
//!
//! Cache scopes (`CacheScope`, from `cortex-request`): a chain starts from its
//! scope's root key, and a lookup verifies a block's parent key, so sequences of
//! two scopes never share a block, computed or pending. A server gives each
//! project its own scope; the shared scope is everyone's.

#![forbid(unsafe_code)]

mod cache;
mod lru;

pub use cache::{
    Allocation, BlockId, BlockState, BrokenInvariant, KvCache, KvError, KvStats, PrefixProbe, SeqId,
};
