//! Which backend sequence holds the KV cells of which accounting block.
//!
//! A block's cells live in the backend tagged with every sequence that
//! computed or copied them. A finished (or preempted) request's sequence may
//! still be the only holder of cells that the accounting keeps as prefix cache;
//! such a sequence is *retired*: it holds cells but runs nothing, until the
//! blocks are evicted or its id is needed again.

use std::collections::{BTreeSet, HashMap, VecDeque};

use cortex_kv::BlockId;

use crate::backend::SeqSlot;

#[derive(Debug, Default)]
pub(crate) struct Slots {
    free: Vec<SeqSlot>,
    /// Retired sequences, oldest first.
    retired: VecDeque<SeqSlot>,
    /// Blocks each sequence holds cells for.
    held: HashMap<SeqSlot, BTreeSet<BlockId>>,
    /// Sequences holding each block's cells, and the block's depth (its
    /// position range is `depth*B .. (depth+1)*B`).
    holders: HashMap<BlockId, (usize, Vec<SeqSlot>)>,
}

impl Slots {
    pub(crate) fn new(count: usize) -> Self {
        Self {
            free: (0..count as SeqSlot).rev().collect(),
            ..Self::default()
        }
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn oldest_retired(&self) -> Option<SeqSlot> {
        self.retired.front().copied()
    }

    pub(crate) fn take(&mut self) -> Option<SeqSlot> {
        self.free.pop()
    }

    /// Records that `slot` has the cells of `block` at `depth`.
    pub(crate) fn hold(&mut self, slot: SeqSlot, block: BlockId, depth: usize) {
        if self.held.entry(slot).or_default().insert(block) {
            self.holders
                .entry(block)
                .or_insert_with(|| (depth, Vec::new()))
                .1
                .push(slot);
        }
    }

    /// Some sequence holding `block`'s cells, with the block's depth.
    pub(crate) fn holder_of(&self, block: BlockId) -> Option<(SeqSlot, usize)> {
        self.holders
            .get(&block)
            .and_then(|(depth, slots)| slots.first().map(|&s| (s, *depth)))
    }

    /// Blocks `slot` holds, with depths.
    pub(crate) fn held_by(&self, slot: SeqSlot) -> Vec<(BlockId, usize)> {
        self.held
            .get(&slot)
            .map(|blocks| blocks.iter().map(|&b| (b, self.holders[&b].0)).collect())
            .unwrap_or_default()
    }

    /// Whether another sequence than `slot` holds `block`.
    pub(crate) fn shared_elsewhere(&self, block: BlockId, slot: SeqSlot) -> bool {
        self.holders
            .get(&block)
            .is_some_and(|(_, slots)| slots.iter().any(|&s| s != slot))
    }

    /// Forgets that `slot` holds `block`.
    pub(crate) fn release(&mut self, slot: SeqSlot, block: BlockId) {
        if let Some(blocks) = self.held.get_mut(&slot) {
            blocks.remove(&block);
        }
        if let Some((_, slots)) = self.holders.get_mut(&block) {
            slots.retain(|&s| s != slot);
            if slots.is_empty() {
                self.holders.remove(&block);
            }
        }
    }

    /// Every holder of `block` (for eviction), forgetting the block.
    pub(crate) fn forget_block(&mut self, block: BlockId) -> Option<(usize, Vec<SeqSlot>)> {
        let (depth, slots) = self.holders.remove(&block)?;
        for slot in &slots {
            if let Some(blocks) = self.held.get_mut(slot) {
                blocks.remove(&block);
            }
        }
        Some((depth, slots))
    }

    /// Marks a sequence that still holds cells as retired, or frees it.
    pub(crate) fn park(&mut self, slot: SeqSlot) {
        if self.held.get(&slot).is_some_and(|b| !b.is_empty()) {
            if !self.retired.contains(&slot) {
                self.retired.push_back(slot);
            }
        } else {
            self.free_slot(slot);
        }
    }

    /// Frees a retired sequence that no longer holds anything.
    pub(crate) fn free_if_empty(&mut self, slot: SeqSlot) -> bool {
        let empty = self.held.get(&slot).is_none_or(BTreeSet::is_empty);
        if empty && self.retired.contains(&slot) {
            self.free_slot(slot);
        }
        empty
    }

    fn free_slot(&mut self, slot: SeqSlot) {
        self.retired.retain(|&s| s != slot);
        self.held.remove(&slot);
        if !self.free.contains(&slot) {
            self.free.push(slot);
        }
    }
}
