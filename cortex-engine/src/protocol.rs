//! What the engine handle and its step loop share: the commands the handle
//! sends, the state both read, the loop's settings, and the channel a
//! request's events come back on. Both `engine` and `step` use this module;
//! neither imports the other's internals.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cortex_request::{RequestId, Work};

use crate::events::{EngineEvent, EngineStats};

/// How to stop an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Refuse new requests, finish the ones in hand, then stop.
    Drain,
    /// Cancel everything in hand (each gets a `cancelled` finish) and stop.
    Abort,
}

/// What the handle asks of the step loop.
pub(crate) enum Command {
    Submit(Vec<(Work, EventSender)>),
    Cancel(RequestId),
    Shutdown(Shutdown),
    /// A question about the model's vocabulary (tokenize, detokenize),
    /// answered from the loop's executor between steps.
    Vocabulary(VocabularyQuery),
}

/// Runs against the loop's executor and sends its answer back itself.
pub(crate) type VocabularyQuery = Box<dyn FnOnce(&dyn crate::executor::Executor) + Send>;

/// What the engine learned about its model and context at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineInfo {
    /// Entries in a row of logits.
    pub n_vocab: usize,
    /// The model's training context.
    pub n_ctx_train: usize,
    /// Longest sequence (prompt plus generation) a request may have.
    pub max_sequence_tokens: usize,
    /// Sequences running at once at most ([`EngineConfig::parallel`](crate::EngineConfig::parallel)),
    /// over every step loop.
    pub parallel: usize,
    /// Step loops sharing the device ([`EngineConfig::step_loops`](crate::EngineConfig::step_loops)).
    pub step_loops: usize,
}

impl EngineInfo {
    /// The facts of an engine whose step loops have `each` of these.
    pub(crate) fn combined(each: &[EngineInfo]) -> EngineInfo {
        let mut all = each[0];
        all.parallel = each.iter().map(|i| i.parallel).sum();
        all.step_loops = each.len();
        all.max_sequence_tokens = each
            .iter()
            .map(|i| i.max_sequence_tokens)
            .min()
            .unwrap_or(0);
        all
    }
}

/// Whether the step loop is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineHealth {
    /// Running (idle or busy).
    Running,
    /// Stopped on request.
    Stopped,
    /// Died: its step loop panicked. Every request it held failed with
    /// [`EngineError::Died`](crate::EngineError::Died) carrying the same message.
    Died(String),
}

pub(crate) struct Shared {
    pub(crate) stats: Mutex<EngineStats>,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) accepting: AtomicBool,
    pub(crate) health: Mutex<EngineHealth>,
}

impl Shared {
    /// A running engine's state before its first request.
    pub(crate) fn new() -> Self {
        Self {
            stats: Mutex::new(EngineStats::default()),
            in_flight: AtomicUsize::new(0),
            accepting: AtomicBool::new(true),
            health: Mutex::new(EngineHealth::Running),
        }
    }

    pub(crate) fn set_health(&self, health: EngineHealth) {
        *self
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = health;
    }
}

/// Where the events of submitted requests go. Clone it to gather the events
/// of many requests in one place (each event names its request).
///
/// The step loop hands over a step's events for one channel together, in
/// one message, at the step's end: a send that wakes a waiting receiver
/// costs microseconds, which a one-sequence step on a GPU would pay per token.
#[derive(Debug, Clone)]
pub struct EventSender {
    batches: flume::Sender<Vec<EngineEvent>>,
    /// Which channel this is, the same for every clone: events bound for
    /// one channel are gathered by it.
    channel: u64,
    /// How long token events may wait to travel with later ones (see
    /// [`event_channel_batched`]); `None`: at the end of their step.
    token_delay: Option<Duration>,
}

impl EventSender {
    /// Hands `events` to the receiver, in order; false when the receiver is
    /// gone (the caller stopped listening, which is not the engine's failure).
    pub(crate) fn send_all(&self, events: Vec<EngineEvent>) -> bool {
        self.batches.send(events).is_ok()
    }

    /// The channel's identity, shared by its clones.
    pub(crate) fn channel(&self) -> u64 {
        self.channel
    }

    /// How long token events may wait; `None`: not past their step.
    pub(crate) fn token_delay(&self) -> Option<Duration> {
        self.token_delay
    }
}

/// The events of the requests submitted with its [`EventSender`], in the
/// order the engine made them. Unbounded: the engine never waits for a slow
/// reader.
#[derive(Debug)]
pub struct EventReceiver {
    batches: flume::Receiver<Vec<EngineEvent>>,
    /// The rest of the last batch received, handed out one at a time.
    ready: Mutex<VecDeque<EngineEvent>>,
}

/// A new channel for engine events: each step's events arrive at its end.
pub fn event_channel() -> (EventSender, EventReceiver) {
    new_channel(None)
}

/// A new channel for a reader that keeps whole responses and only counts
/// tokens as they come (a batch worker's progress): token events may wait up
/// to `token_delay` to travel together, so the engine wakes the reader a few
/// times a second rather than at every step. A request's end is never held
/// back (its tokens arrive first, as always).
pub fn event_channel_batched(token_delay: Duration) -> (EventSender, EventReceiver) {
    new_channel(Some(token_delay))
}

fn new_channel(token_delay: Option<Duration>) -> (EventSender, EventReceiver) {
    static CHANNELS: AtomicU64 = AtomicU64::new(0);
    let (sender, receiver) = flume::unbounded();
    (
        EventSender {
            batches: sender,
            channel: CHANNELS.fetch_add(1, Ordering::Relaxed),
            token_delay,
        },
        EventReceiver {
            batches: receiver,
            ready: Mutex::new(VecDeque::new()),
        },
    )
}

impl EventReceiver {
    /// The next event, waiting for it; `None` once every sender is gone
    /// (the engine stopped and the caller holds none).
    pub fn recv(&self) -> Option<EngineEvent> {
        self.next_from(|| self.batches.recv().ok())
    }

    /// The next event, waiting at most `wait`.
    pub fn recv_timeout(&self, wait: Duration) -> Option<EngineEvent> {
        match Instant::now().checked_add(wait) {
            Some(deadline) => self.next_from(|| self.batches.recv_deadline(deadline).ok()),
            // Longer than a clock can count: no deadline.
            None => self.recv(),
        }
    }

    /// The next event, awaited (on any async runtime).
    pub async fn recv_async(&self) -> Option<EngineEvent> {
        loop {
            if let Some(event) = self.ready().pop_front() {
                return Some(event);
            }
            let batch = self.batches.recv_async().await.ok()?;
            self.ready().extend(batch);
        }
    }

    /// The events already here, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = EngineEvent> + '_ {
        std::iter::from_fn(|| self.next_from(|| self.batches.try_recv().ok()))
    }

    /// Every event, waiting for each, until every sender is gone.
    pub fn iter(&self) -> Events<'_> {
        Events(self)
    }

    /// The rest of the last batch first, then what `receive` brings.
    fn next_from(
        &self,
        mut receive: impl FnMut() -> Option<Vec<EngineEvent>>,
    ) -> Option<EngineEvent> {
        loop {
            if let Some(event) = self.ready().pop_front() {
                return Some(event);
            }
            let batch = receive()?;
            self.ready().extend(batch);
        }
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, VecDeque<EngineEvent>> {
        self.ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every event of an [`EventReceiver`], waiting for each.
#[derive(Debug)]
pub struct Events<'a>(&'a EventReceiver);

impl Iterator for Events<'_> {
    type Item = EngineEvent;

    fn next(&mut self) -> Option<EngineEvent> {
        self.0.recv()
    }
}

impl<'a> IntoIterator for &'a EventReceiver {
    type Item = EngineEvent;
    type IntoIter = Events<'a>;

    fn into_iter(self) -> Events<'a> {
        self.iter()
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(id: u64) -> EngineEvent {
        EngineEvent::Failed {
            id: RequestId(id),
            error: crate::EngineError::Stopped,
        }
    }

    #[test]
    fn a_receiver_hands_out_the_events_of_each_batch_one_at_a_time_in_order() {
        let (sender, receiver) = event_channel();
        assert!(sender.send_all(vec![failed(1), failed(2), failed(3)]));
        assert!(sender.send_all(Vec::new()));
        assert!(sender.send_all(vec![failed(4), failed(5)]));
        assert_eq!(receiver.recv().map(|e| e.id().0), Some(1));
        assert_eq!(
            receiver.recv_timeout(Duration::MAX).map(|e| e.id().0),
            Some(2)
        );
        assert_eq!(
            receiver.try_iter().map(|e| e.id().0).collect::<Vec<_>>(),
            [3, 4, 5],
            "an empty batch is passed over"
        );
        assert!(receiver.recv_timeout(Duration::from_millis(10)).is_none());
        assert!(sender.send_all(vec![failed(6)]));
        drop(sender);
        assert_eq!(
            receiver.iter().map(|e| e.id().0).collect::<Vec<_>>(),
            [6],
            "the events end when every sender is gone"
        );
        assert!(receiver.recv().is_none());
    }
}
