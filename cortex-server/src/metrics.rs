//! `/metrics` in Prometheus' text format through `prometheus-client`, and
//! `/v1/metrics`, the same figures as JSON (for scripts and the dashboard):
//! requests by endpoint and status, online tokens, time to first token and
//! latency histograms, and at each scrape the engine's counters and gauges,
//! the queue's items by state, the device's memory and the process's and
//! machine's CPU and memory. One [`Snapshot`] feeds both.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use cortex_engine::{Device, EngineStats};
use cortex_queue::{JobCounts, WorkerInfo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::pool::Running;
use crate::system::SystemGauges;

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
    system: SystemFamily,
}

/// The process's and the machine's CPU and memory.
#[derive(Default)]
struct SystemFamily {
    process_cpu_seconds: Gauge<f64, AtomicU64>,
    process_cpu_cores: Gauge<f64, AtomicU64>,
    process_resident: Gauge,
    machine_cpu: Gauge<f64, AtomicU64>,
    machine_cpus: Gauge,
    memory_total: Gauge,
    memory_available: Gauge,
}

impl SystemFamily {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_cpu_seconds",
            "CPU time the server process used since it started",
            self.process_cpu_seconds.clone(),
        );
        registry.register(
            "process_cpu_cores",
            "Cores the server process kept busy since the last scrape",
            self.process_cpu_cores.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the server process",
            self.process_resident.clone(),
        );
        registry.register(
            "machine_cpu_utilisation_ratio",
            "Share of all the machine's cores in use since the last scrape",
            self.machine_cpu.clone(),
        );
        registry.register("machine_cpus", "Cores online", self.machine_cpus.clone());
        registry.register(
            "machine_memory_total_bytes",
            "All the machine's memory",
            self.memory_total.clone(),
        );
        registry.register(
            "machine_memory_available_bytes",
            "Memory available to new work without swapping",
            self.memory_available.clone(),
        );
    }

    fn set(&self, gauges: &SystemGauges) {
        let bytes = |b: Option<u64>| b.map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX));
        self.process_cpu_seconds
            .set(gauges.process_cpu_seconds.unwrap_or(0.0));
        self.process_cpu_cores
            .set(gauges.process_cpu_cores.unwrap_or(0.0));
        self.process_resident
            .set(bytes(gauges.process_resident_bytes));
        self.machine_cpu
            .set(gauges.machine_cpu_ratio.unwrap_or(0.0));
        self.machine_cpus.set(bytes(gauges.machine_cpus));
        self.memory_total.set(bytes(gauges.memory_total_bytes));
        self.memory_available
            .set(bytes(gauges.memory_available_bytes));
    }
}

/// Every figure of one scrape, read once for `/metrics` and `/v1/metrics`.
pub(crate) struct Snapshot {
    /// When (Unix ms).
    pub(crate) at: i64,
    pub(crate) stats: EngineStats,
    /// Items of unfinished jobs by state.
    pub(crate) queue: JobCounts,
    /// Online requests in flight.
    pub(crate) online: usize,
    pub(crate) device: Option<Device>,
    /// The device's memory in use for the models.
    pub(crate) device_used: u64,
    pub(crate) system: SystemGauges,
    pub(crate) loaded: Vec<Running>,
    pub(crate) workers: Vec<WorkerInfo>,
}

impl Snapshot {
    /// The figures as JSON: `/v1/metrics`.
    pub(crate) fn to_json(&self, metrics: &Metrics) -> Value {
        let s = &self.stats;
        let q = &self.queue;
        let g = &self.system;
        let millis = |t: Option<std::time::SystemTime>| {
            t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64)
        };
        json!({
            "time": self.at,
            "engine": {
                "steps": s.steps,
                "prompt_tokens": s.prompt_tokens,
                "prefill_tokens": s.prefill_tokens,
                "prefill_tokens_saved": s.prefill_tokens_saved,
                "generated_tokens": s.generated_tokens,
                "requests_finished": s.requests_finished,
                "requests_failed": s.requests_failed,
                "preemptions": s.preemptions,
                "running_sequences": s.running,
                "waiting_requests": s.waiting,
                "kv_utilisation_ratio": s.kv_utilisation,
                "kv_bytes": s.kv_bytes,
            },
            "online": {
                "in_flight": self.online,
                "prompt_tokens": metrics.online_prompt_tokens.get(),
                "generated_tokens": metrics.online_generated_tokens.get(),
            },
            "queue": {
                "items": {
                    "pending": q.pending,
                    "running": q.running,
                    "completed": q.completed,
                    "failed": q.failed,
                    "cancelled": q.cancelled,
                },
                "workers": self.workers,
            },
            "models": self.loaded.iter().map(|r| json!({
                "name": r.model.name,
                "sha256": r.model.sha256,
                "size": r.size,
                "size_vram": r.size_vram,
                "expires_at": millis(r.expires_at),
            })).collect::<Vec<_>>(),
            "device": self.device.as_ref().map(|d| json!({
                "name": d.name,
                "description": d.description,
                "kind": d.kind.to_string(),
                "memory_used_bytes": self.device_used,
                "memory_free_bytes": d.memory_free,
                "memory_total_bytes": d.memory_total,
            })),
            "system": {
                "process_cpu_seconds": g.process_cpu_seconds,
                "process_cpu_cores": g.process_cpu_cores,
                "process_resident_memory_bytes": g.process_resident_bytes,
                "machine_cpu_utilisation_ratio": g.machine_cpu_ratio,
                "machine_cpus": g.machine_cpus,
                "machine_memory_total_bytes": g.memory_total_bytes,
                "machine_memory_available_bytes": g.memory_available_bytes,
            },
        })
    }
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
        let system = SystemFamily::default();
        system.register(&mut registry);
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
            system,
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

    /// The text exposition of `snapshot`, with the gauges and engine
    /// counters brought up to date.
    pub(crate) fn render(&self, snapshot: &Snapshot) -> String {
        let (stats, queue, online) = (&snapshot.stats, &snapshot.queue, snapshot.online);
        // No device before the first model is loaded (none is unloaded for good).
        if let Some(device) = &snapshot.device {
            let label = DeviceLabel {
                device: device.name.clone(),
                kind: device.kind.to_string(),
            };
            let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
            self.device
                .used
                .get_or_create(&label)
                .set(bytes(snapshot.device_used));
            self.device
                .free
                .get_or_create(&label)
                .set(bytes(device.memory_free));
            self.device
                .total
                .get_or_create(&label)
                .set(bytes(device.memory_total));
        }
        self.system.set(&snapshot.system);
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
