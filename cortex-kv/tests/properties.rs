//! Random operation sequences: blocks are conserved, never freed twice,
//! refcounts never go negative, and a lookup never returns an evicted block.

use cortex_kv::{KvCache, KvError};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Allocate a prompt built from a small alphabet of shared prefixes.
    Allocate {
        seq: u64,
        prefix: u8,
        len: usize,
    },
    Append {
        seq: u64,
    },
    Compute {
        seq: u64,
        fraction: u8,
    },
    Fork {
        parent: u64,
        child: u64,
    },
    Free {
        seq: u64,
    },
    /// Evict a block by id (only cached ones go).
    Evict {
        block: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0u64..12;
    prop_oneof![
        (seq.clone(), 0u8..3, 1usize..40).prop_map(|(seq, prefix, len)| Op::Allocate {
            seq,
            prefix,
            len
        }),
        seq.clone().prop_map(|seq| Op::Append { seq }),
        (seq.clone(), 0u8..=4).prop_map(|(seq, fraction)| Op::Compute { seq, fraction }),
        (seq.clone(), seq.clone()).prop_map(|(parent, child)| Op::Fork { parent, child }),
        seq.prop_map(|seq| Op::Free { seq }),
        (0u32..32).prop_map(|block| Op::Evict { block }),
    ]
}

/// Prompts share one of three prefixes, then diverge by sequence id.
fn prompt(prefix: u8, seq: u64, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            if i < 20 {
                u32::from(prefix) * 1000 + i
            } else {
                seq as u32 * 100 + i
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_any_sequence_of_operations(ops in prop::collection::vec(op(), 1..120), blocks in 4usize..24, block_size in 1usize..6) {
        let mut kv = KvCache::new(blocks, block_size).unwrap();
        let mut contents: std::collections::HashMap<u64, Vec<u32>> = Default::default();
        for op in ops {
            let before = kv.stats();
            match op {
                Op::Allocate { seq, prefix, len } => {
                    let tokens = prompt(prefix, seq, len);
                    let needed = kv.blocks_needed(&tokens);
                    match kv.allocate(seq, &tokens) {
                        Ok(allocation) => {
                            prop_assert!(allocation.cached_tokens < tokens.len());
                            // Reused blocks hold exactly this prompt's leading tokens.
                            prop_assert_eq!(&kv.blocks_of(seq).unwrap()[..allocation.reused.len()], &allocation.reused[..]);
                            contents.insert(seq, tokens);
                        }
                        Err(KvError::SequenceExists(_)) => prop_assert!(contents.contains_key(&seq)),
                        Err(KvError::OutOfBlocks { needed: n, available }) => {
                            prop_assert!(needed > before.free_blocks + before.cached_blocks);
                            prop_assert!(n > available);
                            prop_assert_eq!(kv.stats(), before, "a failed allocation changes nothing");
                        }
                        Err(other) => prop_assert!(false, "unexpected {other}"),
                    }
                }
                Op::Append { seq } => {
                    let token = 7_000 + seq as u32;
                    match kv.append(seq, token) {
                        Ok(()) => contents.get_mut(&seq).unwrap().push(token),
                        Err(KvError::UnknownSequence(_)) => prop_assert!(!contents.contains_key(&seq)),
                        Err(KvError::OutOfBlocks { .. }) => prop_assert_eq!(before.free_blocks + before.cached_blocks, 0),
                        Err(other) => prop_assert!(false, "unexpected {other}"),
                    }
                }
                Op::Compute { seq, fraction } => {
                    if let Some((held, _)) = kv.tokens_of(seq) {
                        kv.mark_computed(seq, held * usize::from(fraction) / 4).unwrap();
                    }
                }
                Op::Fork { parent, child } => match kv.fork(parent, child) {
                    Ok(()) => {
                        let tokens = contents[&parent].clone();
                        contents.insert(child, tokens);
                    }
                    Err(KvError::UnknownSequence(_) | KvError::SequenceExists(_) | KvError::OutOfBlocks { .. }) => {}
                    Err(other) => prop_assert!(false, "unexpected {other}"),
                },
                Op::Evict { block } => {
                    let was = kv.block_state(block);
                    let evicted = kv.evict(block);
                    prop_assert_eq!(evicted, was == Some(cortex_kv::BlockState::Cached));
                    if evicted {
                        prop_assert_eq!(kv.block_state(block), Some(cortex_kv::BlockState::Free));
                    }
                }
                Op::Free { seq } => match kv.free(seq) {
                    Ok(_) => { contents.remove(&seq); }
                    Err(KvError::UnknownSequence(_)) => prop_assert!(!contents.contains_key(&seq)),
                    Err(other) => prop_assert!(false, "unexpected {other}"),
                },
            }
            // Conservation, single ownership, refcounts = holders, no double free.
            if let Err(broken) = kv.verify() {
                prop_assert!(false, "{}", broken);
            }
            let stats = kv.stats();
            prop_assert_eq!(stats.used_blocks + stats.cached_blocks + stats.free_blocks, blocks);
            prop_assert!(stats.shared_blocks <= stats.used_blocks);
            // A lookup never returns an evicted (free) block, and what it returns
            // is what a fresh allocation reuses.
            for prefix in 0..3u8 {
                let probe = kv.probe(&prompt(prefix, 99, 30));
                prop_assert!(probe.cached_tokens <= probe.pending_tokens);
                prop_assert_eq!(probe.cached_tokens % block_size, 0);
                let trial = kv.clone().allocate(99, &prompt(prefix, 99, 30));
                if let Ok(allocation) = trial {
                    prop_assert_eq!(allocation.cached_tokens, probe.cached_tokens);
                }
            }
        }
        for seq in contents.keys() {
            kv.free(*seq).unwrap();
        }
        let stats = kv.stats();
        prop_assert_eq!(stats.used_blocks, 0);
        prop_assert_eq!(stats.free_blocks + stats.cached_blocks, blocks);
    }
}
