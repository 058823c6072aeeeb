//! Sending events, and the thread that keeps sending them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cortex_queue::{
    EXPORT_EVENT, Queue, QueueError, QueueOpener, WEBHOOK_ATTEMPTS, WebhookEvent, now_ms,
};

use crate::sign::{SigningSecret, sign};

/// How long a receiver may take to answer.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a deliverer holds the events it took: more than a send's
/// timeout for each of a batch of them, and than writing a big job's
/// results (a million rows as a table, uploaded, take about 15 s here).
const HOLD: Duration = Duration::from_secs(300);
/// Events taken at once.
const BATCH: usize = 8;
/// How often an idle deliverer looks for due events.
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// The shortest pause between looks.
const MIN_WAIT: Duration = Duration::from_millis(50);

/// The function that writes a job's results to the destination it carries
/// (an [`EXPORT_EVENT`] row of the outbox; `event.url` is where)
/// Why an event was not delivered (it is tried again after a backoff).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The receiver answered, not with 2xx.
    #[error("{url} answered HTTP {status}")]
    Refused {
        /// Where the event went.
        url: String,
        /// The HTTP status it answered.
        status: u16,
    },
    /// No answer: the connection, TLS or a timeout failed.
    #[error("{url}: {reason}")]
    Unreachable {
        /// Where the event went.
        url: String,
        /// What failed.
        reason: String,
    },
}

type ExportFn = dyn Fn(&mut dyn Queue, &WebhookEvent) -> Result<(), String> + Send + Sync;

/// Writes a job's results to the destination it carries (an
/// [`EXPORT_EVENT`] row of the outbox; `event.url` is where): `Ok` once
/// written, else what went wrong. Given by the binary, which knows formats
/// and stores.
#[derive(Clone)]
pub struct Exporter(Arc<ExportFn>);

impl Exporter {
    /// An exporter doing `export`.
    pub fn new(
        export: impl Fn(&mut dyn Queue, &WebhookEvent) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(export))
    }
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporter")
    }
}

/// Sends events: POSTs each one's body, signed when there is a secret; hands
/// the outbox's exports to its [`Exporter`].
pub struct Notifier {
    secret: SigningSecret,
    agent: ureq::Agent,
    exporter: Option<Exporter>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("signed", &!self.secret.is_empty())
            .field("exports", &self.exporter.is_some())
            .finish()
    }
}

impl Notifier {
    /// A notifier signing with `secret` (unsigned when it is empty).
    pub fn new(secret: SigningSecret) -> Self {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(SEND_TIMEOUT))
            .http_status_as_error(false)
            .user_agent("cortex-webhooks")
            .tls_config(
                ureq::tls::TlsConfig::builder()
                    .provider(ureq::tls::TlsProvider::NativeTls)
                    .build(),
            )
            .build();
        Self {
            secret,
            agent: config.into(),
            exporter: None,
        }
    }

    /// Writes the outbox's exports with `exporter` too (without one, an
    /// export is recorded as a failed attempt, left for a process that can).
    pub fn with_exporter(mut self, exporter: Exporter) -> Self {
        self.exporter = Some(exporter);
        self
    }

    /// Does what an outbox row asks: an export, or a POST.
    fn handle(&self, store: &mut dyn Queue, event: &WebhookEvent) -> Result<(), String> {
        if event.kind != EXPORT_EVENT {
            return self.send(event).map_err(|e| e.to_string());
        }
        match &self.exporter {
            Some(export) => (export.0)(store, event),
            None => Err("this process does not write job outputs".into()),
        }
    }

    /// Sends one event; `Ok` when the receiver answered 2xx, else what went wrong.
    pub fn send(&self, event: &WebhookEvent) -> Result<(), DeliveryError> {
        let id = cortex_openai::webhook_event_id(event);
        let body = cortex_openai::webhook_event(event).to_string();
        let timestamp = now_ms() / 1000;
        let mut request = self
            .agent
            .post(&event.url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string());
        if !self.secret.is_empty() {
            request = request.header(
                "webhook-signature",
                sign(&self.secret, &id, timestamp, body.as_bytes()),
            );
        }
        match request.send(body.as_bytes()) {
            Ok(answer) if answer.status().is_success() => Ok(()),
            Ok(answer) => Err(DeliveryError::Refused {
                url: event.url.clone(),
                status: answer.status().as_u16(),
            }),
            Err(e) => Err(DeliveryError::Unreachable {
                url: event.url.clone(),
                reason: e.to_string(),
            }),
        }
    }

    /// Delivers the events due now, recording each outcome; how many were
    /// delivered. Stops early once `stop` is set and nothing is in hand.
    pub fn deliver_due(&self, store: &mut dyn Queue) -> Result<usize, QueueError> {
        let mut delivered = 0;
        loop {
            let mut events = store.claim_webhooks(BATCH, HOLD)?;
            if events.is_empty() {
                return Ok(delivered);
            }
            // A job's results are written before its end is announced, so
            // a receiver told `batch.completed` finds them there.
            events.sort_by_key(|e| e.kind != EXPORT_EVENT);
            for event in &events {
                let outcome = if event.kind != EXPORT_EVENT && export_pending(store, event)? {
                    Err("waiting for the job's results to be written first".to_owned())
                } else {
                    self.handle(store, event)
                };
                match outcome {
                    Ok(()) => {
                        tracing::info!(event = event.id, job = %event.job, kind = %event.kind, "outbox event done");
                        store.webhook_delivered(event.id)?;
                        delivered += 1;
                    }
                    Err(error) => {
                        tracing::warn!(event = event.id, job = %event.job, kind = %event.kind, attempt = event.attempts + 1, "outbox event not done: {error}");
                        store.webhook_failed(event.id, &error)?;
                    }
                }
            }
        }
    }
}

/// Whether the job of `event` has results still to write (an export neither
/// done nor given up).
fn export_pending(store: &mut dyn Queue, event: &WebhookEvent) -> Result<bool, QueueError> {
    Ok(store.webhooks(event.job)?.iter().any(|e| {
        e.kind == EXPORT_EVENT && e.delivered_at.is_none() && e.attempts < WEBHOOK_ATTEMPTS
    }))
}

/// A thread delivering events beside a worker or a server, on its own
/// queue connection.
#[derive(Debug)]
pub struct Deliverer {
    stop: Arc<AtomicBool>,
    grace_ms: Arc<std::sync::atomic::AtomicU64>,
    thread: Option<JoinHandle<bool>>,
}

impl Deliverer {
    /// Starts delivering the queue's due events.
    pub fn start(opener: QueueOpener, notifier: Notifier) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let grace_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let thread = {
            let (stop, grace_ms) = (Arc::clone(&stop), Arc::clone(&grace_ms));
            std::thread::Builder::new()
                .name("webhooks".into())
                .spawn(move || run(&opener, &notifier, &stop, &grace_ms))
                .expect("a thread can be started")
        };
        Self {
            stop,
            grace_ms,
            thread: Some(thread),
        }
    }

    /// Stops after delivering what is due, waiting up to `grace` for
    /// events whose next attempt comes within it (a receiver that failed a
    /// moment ago); what is left waits for the next worker or server.
    /// Whether events were left undelivered.
    pub fn finish(mut self, grace: Duration) -> bool {
        self.grace_ms.store(
            u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .is_some_and(|thread| thread.join().unwrap_or(false))
    }
}

impl Drop for Deliverer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Delivers until stopped; whether events were left undelivered then.
fn run(
    opener: &QueueOpener,
    notifier: &Notifier,
    stop: &AtomicBool,
    grace_ms: &std::sync::atomic::AtomicU64,
) -> bool {
    let mut store: Option<Box<dyn Queue>> = None;
    let mut stopping_since: Option<Instant> = None;
    loop {
        let outcome = (|| -> Result<Option<i64>, QueueError> {
            let store = match &mut store {
                Some(store) => store,
                None => store.insert(opener.open()?),
            };
            notifier.deliver_due(store.as_mut())?;
            store.next_webhook_at()
        })();
        let next_at = match outcome {
            Ok(next_at) => next_at,
            Err(e) => {
                tracing::warn!("webhook deliveries: {e}");
                store = None;
                None
            }
        };
        if stop.load(Ordering::SeqCst) {
            let since = *stopping_since.get_or_insert_with(Instant::now);
            let grace = Duration::from_millis(grace_ms.load(Ordering::SeqCst));
            let deadline_ms = now_ms()
                + i64::try_from((grace.saturating_sub(since.elapsed())).as_millis()).unwrap_or(0);
            match next_at {
                Some(at) if at <= deadline_ms => {
                    let wait = Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0));
                    std::thread::sleep(wait.clamp(MIN_WAIT, Duration::from_secs(1)));
                }
                left => return left.is_some(),
            }
        } else {
            let wait = next_at.map_or(LOOK_EVERY, |at| {
                Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0))
                    .clamp(MIN_WAIT, LOOK_EVERY)
            });
            sleep_unless(stop, wait);
        }
    }
}

/// Sleeps `wait`, waking early when `stop` is set.
fn sleep_unless(stop: &AtomicBool, wait: Duration) {
    let until = Instant::now() + wait;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}
