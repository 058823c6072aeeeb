//! `/metrics` in Prometheus' text format through `prometheus-client`:
//! requests by endpoint and status, online tokens, time to first token and
//! latency histograms, and at each scrape the engine's counters and gauges
//! and the queue's items by state.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use cortex_engine::{Device, EngineStats};
use cortex_queue::JobCounts;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabel {
    device: String,
    kind: String,
}

/// The engine's device: its memory, and what the engine uses of it.
#[derive(Default)]
struct DeviceGauges {
    used: Family<DeviceLabel, Gauge>,
    free: Family<DeviceLabel, Gauge>,
    total: Family<DeviceLabel, Gauge>,
}

fn latency_histogram() -> Histogram {
    // 5 ms to about 80 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// The engine's monotonic totals as counters: each scrape adds what grew.
#[derive(Default)]
struct EngineCounters {
    steps: Counter,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    preemptions: Counter,
    seen: Mutex<EngineStats>,
}

pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    online_prompt_tokens: Counter,
    online_generated_tokens: Counter,
    time_to_first_token: Family<EndpointLabel, Histogram>,
    latency: Family<EndpointLabel, Histogram>,
    queue_items: Family<StateLabel, Gauge>,
    running: Gauge,
    waiting: Gauge,
    online_in_flight: Gauge,
    kv_utilisation: Gauge<f64, AtomicU64>,
    engine: EngineCounters,
    device: DeviceGauges,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("cortex");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by endpoint and status",
            requests.clone(),
        );
        let online_prompt_tokens = Counter::default();
        registry.register(
            "online_prompt_tokens",
            "Prompt tokens of online requests",
            online_prompt_tokens.clone(),
        );
        let online_generated_tokens = Counter::default();
        registry.register(
            "online_generated_tokens",
            "Tokens generated for online requests",
            online_generated_tokens.clone(),
        );
        let time_to_first_token = Family::<EndpointLabel, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from an online request's arrival to its first token",
            time_to_first_token.clone(),
        );
        let latency = Family::<EndpointLabel, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "request_duration_seconds",
            "Time from an online request's arrival to its last byte",
            latency.clone(),
        );
        let queue_items = Family::<StateLabel, Gauge>::default();
        registry.register(
            "queue_items",
            "Queue items of unfinished jobs by state",
            queue_items.clone(),
        );
        let running = Gauge::default();
        registry.register(
            "running_sequences",
            "Sequences the engine runs now",
            running.clone(),
        );
        let waiting = Gauge::default();
        registry.register(
            "waiting_requests",
            "Requests waiting in the engine",
            waiting.clone(),
        );
        let online_in_flight = Gauge::default();
        registry.register(
            "online_requests_in_flight",
            "Online requests being answered",
            online_in_flight.clone(),
        );
        let kv_utilisation = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kv_utilisation_ratio",
            "Fraction of KV blocks held by sequences",
            kv_utilisation.clone(),
        );
        let engine = EngineCounters::default();
        registry.register(
            "engine_steps",
            "Engine steps (decode calls)",
            engine.steps.clone(),
        );
        registry.register(
            "engine_prompt_tokens",
            "Prompt tokens of every engine request (online and queue)",
            engine.prompt_tokens.clone(),
        );
        registry.register(
            "engine_generated_tokens",
            "Tokens generated by the engine (online and queue)",
            engine.generated_tokens.clone(),
        );
        registry.register(
            "engine_preemptions",
            "Sequences preempted for recompute",
            engine.preemptions.clone(),
        );
        let device = DeviceGauges::default();
        registry.register(
            "device_memory_used_bytes",
            "Memory of the engine's device in use for it (on the CPU: the process's resident memory)",
            device.used.clone(),
        );
        registry.register(
            "device_memory_free_bytes",
            "Free memory of the engine's device",
            device.free.clone(),
        );
        registry.register(
            "device_memory_total_bytes",
            "All memory of the engine's device",
            device.total.clone(),
        );
        Self {
            registry,
            requests,
            online_prompt_tokens,
            online_generated_tokens,
            time_to_first_token,
            latency,
            queue_items,
            running,
            waiting,
            online_in_flight,
            kv_utilisation,
            engine,
            device,
        }
    }

    /// A request answered with `status`.
    pub(crate) fn request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_owned(),
                status,
            })
            .inc();
    }

    pub(crate) fn first_token(&self, endpoint: &str, after: Duration) {
        self.time_to_first_token
            .get_or_create(&EndpointLabel {
                endpoint: endpoint.to_owned(),
            })
            .observe(after.as_secs_f64());
    }

    /// An online request finished: its tokens and latency.
    pub(crate) fn finished(&self, endpoint: &str, prompt: u64, generated: u64, after: Duration) {
        self.online_prompt_tokens.inc_by(prompt);
        self.online_generated_tokens.inc_by(generated);
        self.latency
            .get_or_create(&EndpointLabel {
                endpoint: endpoint.to_owned(),
            })
            .observe(after.as_secs_f64());
    }

    /// The text exposition, with the gauges and engine counters brought up to date.
    pub(crate) fn render(
        &self,
        stats: &EngineStats,
        queue: &JobCounts,
        online: usize,
        (device, used): (Option<&Device>, u64),
    ) -> String {
        // No device before the first model is loaded (none is unloaded for good).
        if let Some(device) = device {
            let label = DeviceLabel {
                device: device.name.clone(),
                kind: device.kind.to_string(),
            };
            let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
            self.device.used.get_or_create(&label).set(bytes(used));
            self.device
                .free
                .get_or_create(&label)
                .set(bytes(device.memory_free));
            self.device
                .total
                .get_or_create(&label)
                .set(bytes(device.memory_total));
        }
        self.online_in_flight.set(online as i64);
        self.running.set(stats.running as i64);
        self.waiting.set(stats.waiting as i64);
        self.kv_utilisation.set(stats.kv_utilisation);
        for (state, count) in [
            ("pending", queue.pending),
            ("running", queue.running),
            ("completed", queue.completed),
            ("failed", queue.failed),
            ("cancelled", queue.cancelled),
        ] {
            self.queue_items
                .get_or_create(&StateLabel { state })
                .set(count as i64);
        }
        {
            let mut seen = self
                .engine
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.engine
                .steps
                .inc_by(stats.steps.saturating_sub(seen.steps));
            self.engine
                .prompt_tokens
                .inc_by(stats.prompt_tokens.saturating_sub(seen.prompt_tokens));
            self.engine
                .generated_tokens
                .inc_by(stats.generated_tokens.saturating_sub(seen.generated_tokens));
            self.engine
                .preemptions
                .inc_by(stats.preemptions.saturating_sub(seen.preemptions));
            *seen = *stats;
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
