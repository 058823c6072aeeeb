//! What the suite asks of a driver, and the retry timings its cases use.

use std::path::Path;
use std::time::Duration;

use cortex_queue::{Queue, RetryPolicy};

/// Retries fast enough for a test to watch backoff and worker deaths:
/// lone suspects run again at once.
pub const FAST_RETRIES: RetryPolicy = RetryPolicy {
    retry_backoff: Duration::from_millis(50),
    max_retry_backoff: Duration::from_millis(200),
    lone_retry: Duration::ZERO,
};

/// One queue driver under the suite: what the cases need beyond [`Queue`].
pub trait DriverUnderTest {
    /// A fresh, empty queue for the case `test` (a name to tell databases
    /// apart), or `None` when this driver cannot run here (its server is not
    /// configured): the case then passes without running.
    fn fresh(test: &str) -> Option<Self>
    where
        Self: Sized;

    /// Opens the queue [`DriverUnderTest::location`] names, in a child process.
    fn open_location(location: &str) -> Box<dyn Queue>
    where
        Self: Sized;

    /// A directory of this case's own for input and export files.
    fn scratch(&self) -> &Path;

    /// What another process opens this queue by (a path or a URL).
    fn location(&self) -> String;

    /// A new connection to this case's queue that retries by `retry`.
    fn open_with(&self, retry: RetryPolicy) -> Box<dyn Queue>;

    /// The driver's own consistency check of what it stores; panics on a fault.
    fn check(&self);

    /// How many grammars the store holds, and the longest stored request in
    /// bytes: a job's shared grammar must be stored once, not in each item.
    fn stored_grammars_and_longest_request(&self) -> (i64, i64);

    /// A new connection with the default retries.
    fn open(&self) -> Box<dyn Queue> {
        self.open_with(RetryPolicy::default())
    }

    /// A new connection with [`FAST_RETRIES`].
    fn open_fast(&self) -> Box<dyn Queue> {
        self.open_with(FAST_RETRIES)
    }
}
