//! Events wait here until the step that made them ends; then each channel
//! gets its events in one message: one wake-up of a waiting receiver a step
//! instead of one a token. A channel made with
//! [`crate::event_channel_batched`] lets token events wait longer, until its
//! delay has passed or one of its requests ends. Order within a channel is
//! the order made.

use std::collections::HashMap;
use std::time::Instant;

use crate::events::EngineEvent;
use crate::protocol::EventSender;

#[derive(Default)]
pub(super) struct Outbox {
    /// Each channel with events waiting, by its identity (order matters
    /// only within a channel).
    pending: HashMap<u64, Pending>,
    /// Whether a request's end waits (then its channel goes at the next flush).
    ends: bool,
}

struct Pending {
    to: EventSender,
    events: Vec<EngineEvent>,
    /// When its token events must go at the latest; `None`: at the next delivery.
    due: Option<Instant>,
}

impl Outbox {
    /// Queues `event` for `to`'s channel.
    pub(super) fn push(&mut self, to: &EventSender, event: EngineEvent) {
        let pending = self.pending.entry(to.channel()).or_insert_with(|| Pending {
            to: to.clone(),
            events: Vec::new(),
            due: to.token_delay().map(|delay| Instant::now() + delay),
        });
        if event.is_terminal() {
            pending.due = None;
            self.ends = true;
        }
        pending.events.push(event);
    }

    /// Whether a request's end is among the events waiting.
    pub(super) fn holds_end(&self) -> bool {
        self.ends
    }

    /// Hands each channel its events that are due (every one when
    /// `everything`: the loop is about to wait or stop).
    pub(super) fn flush(&mut self, everything: bool) {
        if self.pending.is_empty() {
            return;
        }
        let now = Instant::now();
        self.pending.retain(|_, pending| {
            let due = everything || pending.due.is_none_or(|due| due <= now);
            if due {
                // A receiver that is gone stopped listening; not a failure.
                let _ = pending.to.send_all(std::mem::take(&mut pending.events));
            }
            !due
        });
        self.ends = false;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cortex_request::RequestId;

    use super::*;
    use crate::EngineError;
    use crate::protocol::{EventReceiver, event_channel, event_channel_batched};

    fn token(id: u64) -> EngineEvent {
        EngineEvent::Token {
            id: RequestId(id),
            index: 0,
            token: 7,
            text: String::new(),
            reasoning: String::new(),
            calls: Vec::new(),
            call_pieces: Vec::new(),
            logprob: None,
        }
    }

    fn failed(id: u64) -> EngineEvent {
        EngineEvent::Failed {
            id: RequestId(id),
            error: EngineError::Stopped,
        }
    }

    fn ids(rx: &EventReceiver) -> Vec<u64> {
        rx.try_iter().map(|e| e.id().0).collect()
    }

    #[test]
    fn each_channel_gets_its_events_in_order_once_flushed() {
        let (a, a_rx) = event_channel();
        let (b, b_rx) = event_channel();
        let mut outbox = Outbox::default();
        outbox.push(&a, token(1));
        outbox.push(&b, token(2));
        assert!(!outbox.holds_end());
        outbox.push(&a.clone(), failed(3));
        assert!(outbox.holds_end());
        assert_eq!(ids(&a_rx), [0u64; 0], "nothing leaves before the flush");
        outbox.flush(false);
        assert!(!outbox.holds_end());
        assert_eq!(ids(&a_rx), [1, 3]);
        assert_eq!(ids(&b_rx), [2]);
        outbox.push(&b, token(4));
        outbox.flush(false);
        assert_eq!(ids(&b_rx), [4]);
        assert_eq!(ids(&a_rx), [0u64; 0]);
    }

    #[test]
    fn batched_tokens_wait_for_their_delay_an_end_or_a_flush_of_everything() {
        let (slow, slow_rx) = event_channel_batched(Duration::from_secs(3600));
        let (fast, fast_rx) = event_channel();
        let mut outbox = Outbox::default();
        outbox.push(&slow, token(1));
        outbox.push(&fast, token(2));
        outbox.flush(false);
        assert_eq!(ids(&fast_rx), [2]);
        assert_eq!(ids(&slow_rx), [0u64; 0], "tokens wait for their delay");
        outbox.push(&slow, token(1));
        outbox.push(&fast, token(3));
        outbox.flush(false);
        assert_eq!(
            ids(&fast_rx),
            [3],
            "a waiting channel keeps no other one waiting"
        );
        outbox.push(&slow, failed(5));
        outbox.flush(false);
        assert_eq!(
            ids(&slow_rx),
            [1, 1, 5],
            "an end takes the tokens before it along"
        );
        outbox.push(&slow, token(6));
        outbox.flush(true);
        assert_eq!(ids(&slow_rx), [6]);

        let (soon, soon_rx) = event_channel_batched(Duration::ZERO);
        outbox.push(&soon, token(7));
        outbox.flush(false);
        assert_eq!(ids(&soon_rx), [7], "past its delay, it goes");
    }
}
