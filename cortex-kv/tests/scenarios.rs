//! Exact behaviour of the block accounting on small hand-made cases.

use cortex_kv::{KvCache, KvError, PrefixProbe};

fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn allocation_is_all_or_nothing() {
    let mut kv = KvCache::new(3, 4).unwrap();
    kv.allocate(1, &tokens(0..8)).unwrap();
    let err = kv.allocate(2, &tokens(100..108)).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            needed: 2,
            available: 1
        }
    );
    assert!(!kv.contains(2));
    assert_eq!(kv.stats().free_blocks, 1);
    kv.verify().unwrap();
}

#[test]
fn decode_grows_the_table_one_block_at_a_time() {
    let mut kv = KvCache::new(4, 4).unwrap();
    kv.allocate(1, &tokens(0..3)).unwrap();
    assert_eq!(kv.blocks_of(1).unwrap().len(), 1);
    kv.append(1, 3).unwrap(); // fills block 0
    assert_eq!(kv.blocks_of(1).unwrap().len(), 1);
    kv.append(1, 4).unwrap(); // needs block 1
    assert_eq!(kv.blocks_of(1).unwrap().len(), 2);
    let stats = kv.stats();
    assert_eq!(stats.used_blocks, 2);
    assert_eq!(stats.slack_tokens, 3);
    assert!((stats.fragmentation - 3.0 / 8.0).abs() < 1e-12);
    kv.verify().unwrap();
}

#[test]
fn the_last_token_of_a_prompt_is_always_computed() {
    let mut kv = KvCache::new(8, 4).unwrap();
    kv.allocate(1, &tokens(0..8)).unwrap();
    kv.mark_computed(1, 8).unwrap();
    // Same 8 tokens: only the first block is reused; the second holds the last
    // token, whose logits must be computed.
    let again = kv.allocate(2, &tokens(0..8)).unwrap();
    assert_eq!(again.cached_tokens, 4);
    let longer = kv.allocate(3, &tokens(0..9)).unwrap();
    assert_eq!(longer.cached_tokens, 8);
    kv.verify().unwrap();
}

#[test]
fn uncomputed_blocks_are_pending_not_cached() {
    let mut kv = KvCache::new(8, 4).unwrap();
    kv.allocate(1, &tokens(0..12)).unwrap();
    assert_eq!(
        kv.probe(&tokens(0..13)),
        PrefixProbe {
            cached_tokens: 0,
            pending_tokens: 12
        }
    );
    kv.mark_computed(1, 5).unwrap();
    assert_eq!(
        kv.probe(&tokens(0..13)),
        PrefixProbe {
            cached_tokens: 4,
            pending_tokens: 12
        }
    );
    kv.mark_computed(1, 12).unwrap();
    assert_eq!(
        kv.probe(&tokens(0..13)),
        PrefixProbe {
            cached_tokens: 12,
            pending_tokens: 12
        }
    );
    // Freed before computing: nothing pending remains.
    kv.allocate(2, &tokens(50..62)).unwrap();
    kv.free(2).unwrap();
    assert_eq!(kv.probe(&tokens(50..63)), PrefixProbe::default());
    kv.verify().unwrap();
}

#[test]
fn cached_blocks_are_evicted_lru_and_deepest_first() {
    let mut kv = KvCache::new(4, 2).unwrap();
    kv.allocate(1, &tokens(0..4)).unwrap();
    kv.mark_computed(1, 4).unwrap();
    kv.free(1).unwrap();
    assert_eq!(kv.stats().cached_blocks, 2);
    // Needs 3 of the 4 blocks: 2 free + 1 evicted, the deeper block of seq 1.
    kv.allocate(2, &tokens(100..106)).unwrap();
    assert_eq!(kv.stats().evictions, 1);
    assert_eq!(kv.drain_evicted().len(), 1);
    assert!(kv.drain_evicted().is_empty());
    assert_eq!(
        kv.probe(&tokens(0..5)).cached_tokens,
        2,
        "the shallow block survives"
    );
    kv.verify().unwrap();
}

#[test]
fn reusing_a_cached_block_takes_it_out_of_the_cache() {
    let mut kv = KvCache::new(3, 2).unwrap();
    kv.allocate(1, &tokens(0..4)).unwrap();
    kv.mark_computed(1, 4).unwrap();
    kv.free(1).unwrap();
    // 3 tokens: the first block comes from the cache, the second is new.
    assert_eq!(kv.blocks_needed(&tokens(0..3)), 2);
    let a = kv.allocate(2, &tokens(0..3)).unwrap();
    assert_eq!(a.cached_tokens, 2);
    let stats = kv.stats();
    assert_eq!(
        (stats.used_blocks, stats.cached_blocks, stats.free_blocks),
        (2, 1, 0)
    );
    kv.verify().unwrap();
}

#[test]
fn fork_shares_full_blocks_and_copies_the_partial_one() {
    let mut kv = KvCache::new(8, 4).unwrap();
    kv.allocate(1, &tokens(0..6)).unwrap();
    kv.mark_computed(1, 6).unwrap();
    kv.fork(1, 2).unwrap();
    let (a, b) = (
        kv.blocks_of(1).unwrap().to_vec(),
        kv.blocks_of(2).unwrap().to_vec(),
    );
    assert_eq!(a[0], b[0]);
    assert_ne!(a[1], b[1]);
    assert_eq!(kv.stats().shared_blocks, 1);
    kv.append(1, 6).unwrap();
    kv.append(2, 7).unwrap();
    assert_eq!(kv.fork(1, 2), Err(KvError::SequenceExists(2)));
    kv.free(1).unwrap();
    assert_eq!(kv.stats().shared_blocks, 0);
    kv.free(2).unwrap();
    assert_eq!(kv.free(2), Err(KvError::UnknownSequence(2)));
    kv.verify().unwrap();
}

#[test]
fn a_hash_collision_cannot_share_wrong_content() {
    // Different contents never match, whatever the hash does: the index checks
    // the stored tokens and the parent key.
    let mut kv = KvCache::new(8, 2).unwrap();
    kv.allocate(1, &[1, 2, 3, 4, 5]).unwrap();
    kv.mark_computed(1, 5).unwrap();
    assert_eq!(kv.probe(&[1, 2, 9, 4, 5]).cached_tokens, 2);
    assert_eq!(kv.probe(&[2, 1, 3, 4, 5]).cached_tokens, 0);
}

#[test]
fn errors_say_what_was_wrong() {
    let mut kv = KvCache::new(2, 4).unwrap();
    assert_eq!(
        KvCache::new(0, 4).unwrap_err().to_string(),
        "invalid KV configuration: the pool needs at least one block"
    );
    kv.allocate(1, &tokens(0..3)).unwrap();
    assert_eq!(
        kv.mark_computed(1, 4).unwrap_err().to_string(),
        "sequence 1 holds 3 tokens; 4 cannot be computed"
    );
    assert_eq!(
        kv.allocate(1, &[1]).unwrap_err().to_string(),
        "sequence 1 already holds blocks"
    );
    assert_eq!(
        kv.allocate(2, &tokens(0..9)).unwrap_err().to_string(),
        "out of KV blocks: 3 needed, 1 free or evictable"
    );
}

#[test]
fn explicit_eviction_and_block_states() {
    use cortex_kv::BlockState;
    let mut kv = KvCache::new(4, 2).unwrap();
    kv.allocate(1, &tokens(0..5)).unwrap();
    kv.mark_computed(1, 5).unwrap();
    let blocks = kv.blocks_of(1).unwrap().to_vec();
    assert_eq!(kv.block_state(blocks[0]), Some(BlockState::Used));
    assert!(!kv.evict(blocks[0]), "a used block is not evicted");
    kv.free(1).unwrap();
    assert_eq!(kv.block_state(blocks[0]), Some(BlockState::Cached));
    assert_eq!(
        kv.block_state(blocks[2]),
        Some(BlockState::Free),
        "the partial block is not cached"
    );
    assert!(kv.evict(blocks[0]));
    assert_eq!(kv.block_state(blocks[0]), Some(BlockState::Free));
    assert_eq!(kv.probe(&tokens(0..5)).cached_tokens, 0);
    assert_eq!(kv.block_state(99), None);
    kv.verify().unwrap();
}

#[test]
fn without_prefix_caching_nothing_is_reused() {
    let mut kv = KvCache::new(8, 2).unwrap();
    kv.set_prefix_caching(false);
    kv.allocate(1, &tokens(0..5)).unwrap();
    assert_eq!(kv.probe(&tokens(0..5)).pending_tokens, 0);
    kv.mark_computed(1, 5).unwrap();
    assert_eq!(kv.allocate(2, &tokens(0..5)).unwrap().cached_tokens, 0);
    kv.free(1).unwrap();
    assert_eq!(kv.stats().cached_blocks, 0);
    kv.verify().unwrap();
}

#[test]
fn scopes_share_no_prefix() {
    use cortex_request::CacheScope;
    let mut kv = KvCache::new(16, 4).unwrap();
    let alpha = CacheScope::named("alpha");
    let beta = CacheScope::named("beta");
    assert_ne!(alpha, beta);
    kv.allocate_in(1, alpha, &tokens(0..12)).unwrap();
    // Pending blocks of another scope are not offered either.
    assert_eq!(kv.probe_in(beta, &tokens(0..13)), PrefixProbe::default());
    kv.mark_computed(1, 12).unwrap();
    kv.append(1, 12).unwrap();
    kv.append(1, 13).unwrap();
    kv.append(1, 14).unwrap();
    kv.append(1, 15).unwrap();
    kv.mark_computed(1, 16).unwrap();
    assert_eq!(kv.probe_in(beta, &tokens(0..17)).cached_tokens, 0);
    assert_eq!(kv.probe(&tokens(0..17)).cached_tokens, 0);
    assert_eq!(kv.blocks_needed_in(beta, &tokens(0..13)), 4);
    let other = kv.allocate_in(2, beta, &tokens(0..13)).unwrap();
    assert_eq!(other.cached_tokens, 0);
    // The same scope reuses the prompt and the generated block alike.
    assert_eq!(kv.probe_in(alpha, &tokens(0..17)).cached_tokens, 16);
    let same = kv.allocate_in(3, alpha, &tokens(0..17)).unwrap();
    assert_eq!(same.cached_tokens, 16);
    kv.verify().unwrap();
}
