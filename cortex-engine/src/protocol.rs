//! What the engine handle and its step loop share: the commands the handle
//! sends, the state both read, the loop's settings, and the channel a
//! request's events come back on. Both `engine` and `step` use this module;
//! neither imports the other's internals.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

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
}

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
#[derive(Debug, Clone)]
pub struct EventSender(flume::Sender<EngineEvent>);

impl EventSender {
    /// Hands `event` to the receiver; false when the receiver is gone (the
    /// caller stopped listening, which is not the engine's failure).
    pub(crate) fn send(&self, event: EngineEvent) -> bool {
        self.0.send(event).is_ok()
    }
}

/// The events of the requests submitted with its [`EventSender`], in the
/// order the engine made them. Unbounded: the engine never waits for a slow
/// reader.
#[derive(Debug)]
pub struct EventReceiver(flume::Receiver<EngineEvent>);

/// A new channel for engine events.
pub fn event_channel() -> (EventSender, EventReceiver) {
    let (sender, receiver) = flume::unbounded();
    (EventSender(sender), EventReceiver(receiver))
}

impl EventReceiver {
    /// The next event, waiting for it; `None` once every sender is gone
    /// (the engine stopped and the caller holds none).
    pub fn recv(&self) -> Option<EngineEvent> {
        self.0.recv().ok()
    }

    /// The next event, waiting at most `wait`.
    pub fn recv_timeout(&self, wait: Duration) -> Option<EngineEvent> {
        self.0.recv_timeout(wait).ok()
    }

    /// The next event, awaited (on any async runtime).
    pub async fn recv_async(&self) -> Option<EngineEvent> {
        self.0.recv_async().await.ok()
    }

    /// The events already here, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = EngineEvent> + '_ {
        self.0.try_iter()
    }

    /// Every event, waiting for each, until every sender is gone.
    pub fn iter(&self) -> Events<'_> {
        Events(self.0.iter())
    }
}

/// Every event of an [`EventReceiver`], waiting for each.
#[derive(Debug)]
pub struct Events<'a>(flume::Iter<'a, EngineEvent>);

impl Iterator for Events<'_> {
    type Item = EngineEvent;

    fn next(&mut self) -> Option<EngineEvent> {
        self.0.next()
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
