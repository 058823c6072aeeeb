//! The loaded models: which engines are up, who uses each, and when an
//! idle one goes. A user (a server's request, or its queue worker's turn)
//! names its model; the pool loads it on demand (one load at a time), keeps
//! it while users hold it and for its `keep_alive` after the last (Ollama's
//! semantics: 5 minutes by default, `0` unloads at once, a negative value
//! keeps it), and stays within the memory budget by unloading the least
//! recently used idle model first. A model in use is never unloaded; a
//! user that cannot fit waits for one to end, then gets
//! [`PoolError::Busy`] ([`PoolError::TooLarge`] if the model is larger than
//! the whole budget). The server maps these to HTTP statuses.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use cortex_engine::{Device, Engine, EngineError, EngineHealth, EngineStats};
use cortex_models::{ModelName, Registry, RegistryError};
use cortex_queue::BadDuration;

use cortex_worker::{EngineSource, HoldError, ModelDemand, ModelIdentity};

/// Why the pool cannot give a model.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    /// No model has that name (the registry's message lists what is installed).
    #[error("{0}")]
    NotFound(RegistryError),
    /// The model is larger than the whole memory budget.
    #[error(
        "the model {model} needs {} MiB, more than this server's model memory budget of {} MiB (--model-memory-mib)",
        mib(*need),
        mib(*budget)
    )]
    TooLarge {
        model: String,
        /// Its file's bytes.
        need: u64,
        /// The budget's bytes.
        budget: u64,
    },
    /// No room for it now: the loaded models are in use.
    #[error(
        "the model {model} cannot be loaded now: the loaded models ({}) are answering requests and there is no room beside them ({room}); try again later",
        busy.join(", ")
    )]
    Busy {
        model: String,
        /// The loaded models answering requests.
        busy: Vec<String>,
        /// What the pool holds at most, in words.
        room: String,
    },
    /// The registry failed to look the model up.
    #[error("model {model}: {source}")]
    Registry {
        model: String,
        source: RegistryError,
    },
    /// The model's engine did not start.
    #[error("cannot load {model}: {source}")]
    Load { model: String, source: EngineError },
}

/// How long a model stays loaded after its last request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Until the server stops (or the memory budget needs its place).
    Forever,
    /// This long (zero: unloaded as soon as its last request ends).
    For(Duration),
}

impl KeepAlive {
    /// Ollama's default: five minutes.
    pub const DEFAULT: KeepAlive = KeepAlive::For(Duration::from_secs(300));

    /// Seconds (a number, as Ollama takes it): negative keeps the model.
    pub fn from_seconds(seconds: f64) -> Self {
        if seconds < 0.0 {
            KeepAlive::Forever
        } else {
            KeepAlive::For(Duration::from_secs_f64(seconds.min(1e9)))
        }
    }

    /// A duration as text: `5m`, `1h30m`, `45s`, `500ms`, `-1`, or bare seconds.
    pub fn parse_text(text: &str) -> Result<Self, BadDuration> {
        let text = text.trim();
        let bad = || BadDuration {
            what: "keep_alive",
            text: text.to_owned(),
            must_be: "a duration",
            like: "\"5m\", \"1h\", \"30s\", \"0\" or \"-1\"",
        };
        if let Ok(seconds) = text.parse::<f64>() {
            return if seconds.is_finite() {
                Ok(Self::from_seconds(seconds))
            } else {
                Err(bad())
            };
        }
        if text.starts_with('-') {
            return Ok(KeepAlive::Forever);
        }
        let duration = cortex_queue::parse_duration(text).ok_or_else(bad)?;
        Ok(Self::from_seconds(duration.as_secs_f64()))
    }
}

type StartFn = dyn Fn(&ModelIdentity) -> Result<Engine, EngineError> + Send + Sync;

/// Starts an engine for a model (the CLI's settings turned into an
/// `EngineConfig`): how the server loads a model a request asks for.
#[derive(Clone)]
pub struct EngineStarter(Arc<StartFn>);

impl EngineStarter {
    /// A starter calling `start`.
    pub fn new(
        start: impl Fn(&ModelIdentity) -> Result<Engine, EngineError> + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(start))
    }

    fn start(&self, model: &ModelIdentity) -> Result<Engine, EngineError> {
        (self.0)(model)
    }
}

impl std::fmt::Debug for EngineStarter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineStarter")
    }
}

/// A model in memory.
pub(crate) struct LoadedModel {
    /// Which model.
    pub model: ModelIdentity,
    /// Its engine.
    pub engine: Engine,
}

/// A request's hold on a loaded model: the model is not unloaded while it
/// lives; when it drops, the model's keep-alive starts.
pub(crate) struct ModelUse {
    pool: Arc<ModelPool>,
    loaded: Arc<LoadedModel>,
    keep_alive: Option<KeepAlive>,
    /// The model asked for: the loaded one, or another name of its weights
    /// (with its own template and settings).
    asked: ModelIdentity,
}

impl ModelUse {
    /// The model the request asked for (its name is the answer's `model`).
    pub(crate) fn asked(&self) -> &ModelIdentity {
        &self.asked
    }
}

impl std::ops::Deref for ModelUse {
    type Target = LoadedModel;

    fn deref(&self) -> &LoadedModel {
        &self.loaded
    }
}

impl AsRef<Engine> for ModelUse {
    fn as_ref(&self) -> &Engine {
        &self.loaded.engine
    }
}

/// The pool as the engines of a server's queue worker: it takes the models
/// of its jobs from the pool, beside the online requests; a model that
/// cannot be loaded now (no room, or its file fails) is left out for a
/// while, not an error.
pub(crate) struct PoolEngines(pub(crate) Arc<ModelPool>);

impl EngineSource for PoolEngines {
    type Held = ModelUse;

    fn model(
        &mut self,
        sha256: &str,
        demand: &ModelDemand,
    ) -> Result<Option<ModelIdentity>, HoldError> {
        if let Some(model) = self.0.find_loaded(sha256) {
            return Ok(Some(model));
        }
        demand
            .entry(sha256, self.0.registry())
            .map(|entry| entry.map(ModelIdentity::from))
            .map_err(|e| HoldError::Unavailable(e.to_string()))
    }

    fn hold(&mut self, model: &ModelIdentity) -> Result<ModelUse, HoldError> {
        self.0
            .acquire(model, None)
            .map_err(|e| HoldError::Unavailable(format!("cannot load it for its jobs now: {e}")))
    }
}

impl Drop for ModelUse {
    fn drop(&mut self) {
        self.pool.release(&self.loaded, self.keep_alive);
    }
}

struct Slot {
    loaded: Arc<LoadedModel>,
    users: usize,
    /// When an idle model goes (`None`: never).
    expires_at: Option<SystemTime>,
    last_used: Instant,
    file_size: u64,
}

impl Slot {
    /// What it takes: its weights and its KV memory now.
    fn size(&self) -> u64 {
        self.file_size + self.loaded.engine.stats().kv_bytes
    }
}

#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    /// A model is being loaded (one at a time).
    loading: bool,
    /// Counters of the engines unloaded so far, so the totals never go back.
    retired: EngineStats,
    /// The device the last engine ran on.
    device: Option<Device>,
}

impl std::str::FromStr for KeepAlive {
    type Err = BadDuration;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse_text(text)
    }
}

/// The shortest text [`KeepAlive::parse_text`] reads back as the same value.
impl std::fmt::Display for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let KeepAlive::For(duration) = self else {
            return f.write_str("-1");
        };
        let (secs, millis) = (duration.as_secs(), duration.subsec_millis());
        match (secs, millis) {
            (0, 0) => f.write_str("0"),
            (s, 0) if s % 3600 == 0 => write!(f, "{}h", s / 3600),
            (s, 0) if s % 60 == 0 => write!(f, "{}m", s / 60),
            (s, 0) => write!(f, "{s}s"),
            _ => write!(f, "{}ms", duration.as_millis()),
        }
    }
}

/// A loaded model as `/api/ps` shows it.
pub(crate) struct Running {
    /// Which model.
    pub model: ModelIdentity,
    /// Bytes it takes: weights and KV memory (at least what it has on a GPU).
    pub size: u64,
    /// Bytes of it on a GPU.
    pub size_vram: u64,
    /// When it goes if it stays idle (`None`: never).
    pub expires_at: Option<SystemTime>,
}

/// How the pool is sized.
#[derive(Debug, Clone)]
pub struct PoolLimits {
    /// How long an idle model stays loaded unless a request says otherwise.
    pub keep_alive: KeepAlive,
    /// Most bytes the loaded models may take (weights plus KV memory); 0: no limit.
    pub memory_budget: u64,
    /// Most models loaded at once.
    pub max_loaded: usize,
    /// How long a request waits for room before a 503.
    pub load_wait: Duration,
}

impl PoolLimits {
    /// [`PoolLimits::max_loaded`] by default.
    pub const DEFAULT_MAX_LOADED: usize = 3;
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            keep_alive: KeepAlive::DEFAULT,
            memory_budget: 0,
            max_loaded: Self::DEFAULT_MAX_LOADED,
            load_wait: Duration::from_secs(60),
        }
    }
}

/// The loaded models, shared by a server's requests and its queue worker.
pub(crate) struct ModelPool {
    registry: Registry,
    default: ModelIdentity,
    starter: EngineStarter,
    limits: PoolLimits,
    slots: Mutex<Slots>,
    changed: Condvar,
}

fn file_size(model: &ModelIdentity) -> u64 {
    std::fs::metadata(&model.path).map_or(0, |m| m.len())
}

fn add_counters(total: &mut EngineStats, stats: &EngineStats) {
    total.steps += stats.steps;
    total.prompt_tokens += stats.prompt_tokens;
    total.prefill_tokens += stats.prefill_tokens;
    total.prefill_tokens_saved += stats.prefill_tokens_saved;
    total.generated_tokens += stats.generated_tokens;
    total.requests_finished += stats.requests_finished;
    total.requests_failed += stats.requests_failed;
    total.preemptions += stats.preemptions;
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

impl ModelPool {
    /// A pool holding `engine` for the server's default model, idle.
    pub(crate) fn new(
        registry: Registry,
        default: ModelIdentity,
        engine: Engine,
        starter: EngineStarter,
        limits: PoolLimits,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            registry,
            starter,
            limits,
            slots: Mutex::new(Slots::default()),
            changed: Condvar::new(),
            default: default.clone(),
        });
        let mut slots = pool.lock();
        slots.device = Some(engine.device());
        slots.slots.push(Slot {
            file_size: file_size(&default),
            loaded: Arc::new(LoadedModel {
                model: default,
                engine,
            }),
            users: 0,
            expires_at: pool.expiry(None),
            last_used: Instant::now(),
        });
        drop(slots);
        pool
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The registry the pool loads from.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The server's default model (what `default`, or no `model`, means).
    pub(crate) fn default_model(&self) -> &ModelIdentity {
        &self.default
    }

    fn expiry(&self, keep_alive: Option<KeepAlive>) -> Option<SystemTime> {
        match keep_alive.unwrap_or(self.limits.keep_alive) {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => Some(SystemTime::now() + d),
        }
    }

    /// The model a request's `model` names: none, `default` or the default
    /// model's name mean the default; any other name goes to the registry
    /// (a known model is fetched on first use). Blocking: call it off the
    /// async threads.
    pub(crate) fn identify(&self, asked: Option<&str>) -> Result<ModelIdentity, PoolError> {
        self.named(asked, true)
    }

    /// [`ModelPool::identify`] without fetching a known model (to describe it).
    pub(crate) fn describe(&self, asked: Option<&str>) -> Result<ModelIdentity, PoolError> {
        self.named(asked, false)
    }

    fn named(&self, asked: Option<&str>, fetch: bool) -> Result<ModelIdentity, PoolError> {
        let asked = match asked {
            None | Some("" | "default") => return Ok(self.default.clone()),
            Some(asked) => asked,
        };
        if asked == self.default.name
            || asked
                .parse::<ModelName>()
                .is_ok_and(|name| name.to_string().eq_ignore_ascii_case(&self.default.name))
        {
            return Ok(self.default.clone());
        }
        let found = if fetch {
            self.registry.resolve(asked)
        } else {
            self.registry.identify(asked)
        };
        match found {
            Ok(entry) => Ok(ModelIdentity::from(entry)),
            Err(error @ (RegistryError::Unknown { .. } | RegistryError::Name(_))) => {
                Err(PoolError::NotFound(error))
            }
            Err(source) => Err(PoolError::Registry {
                model: asked.to_owned(),
                source,
            }),
        }
    }

    /// The loaded model with this SHA-256, if any (not counted as a use).
    pub(crate) fn find_loaded(&self, sha256: &str) -> Option<ModelIdentity> {
        self.lock()
            .slots
            .iter()
            .find(|s| s.loaded.model.sha256 == sha256)
            .map(|s| s.loaded.model.clone())
    }

    /// Holds `model`, loading it first if it is not loaded (unloading idle
    /// models, least recently used first, to make room). Blocking.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        model: &ModelIdentity,
        keep_alive: Option<KeepAlive>,
    ) -> Result<ModelUse, PoolError> {
        let deadline = Instant::now() + self.limits.load_wait;
        let need = file_size(model);
        let budget = self.limits.memory_budget;
        if budget > 0 && need > budget {
            return Err(PoolError::TooLarge {
                model: model.name.clone(),
                need,
                budget,
            });
        }
        let mut slots = self.lock();
        loop {
            // A dead engine is dropped, so the next request loads it afresh.
            let dead: Vec<Arc<LoadedModel>> = {
                let mut dead = Vec::new();
                slots.slots.retain(|s| {
                    let alive =
                        !matches!(s.loaded.engine.health(), EngineHealth::Died(_)) || s.users > 0;
                    if !alive {
                        dead.push(Arc::clone(&s.loaded));
                    }
                    alive
                });
                dead
            };
            for loaded in &dead {
                tracing::error!(model = %loaded.model.name, "its engine died: it will be loaded again");
                add_counters(&mut slots.retired, &loaded.engine.stats());
            }
            if let Some(slot) = slots
                .slots
                .iter_mut()
                .find(|s| s.loaded.model.sha256 == model.sha256)
            {
                slot.users += 1;
                slot.last_used = Instant::now();
                return Ok(ModelUse {
                    pool: Arc::clone(self),
                    loaded: Arc::clone(&slot.loaded),
                    keep_alive,
                    asked: model.clone(),
                });
            }
            if !slots.loading {
                if self.fits(&slots, need) {
                    break;
                }
                let evicted = self.make_room(&mut slots, need);
                if !evicted.is_empty() {
                    drop(slots);
                    drop(evicted); // engines shut down here, outside the lock
                    slots = self.lock();
                    continue;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let busy: Vec<String> = slots
                    .slots
                    .iter()
                    .filter(|s| s.users > 0)
                    .map(|s| s.loaded.model.name.clone())
                    .collect();
                let room = if budget > 0 {
                    format!(
                        "at most {} models in {} MiB",
                        self.limits.max_loaded,
                        mib(budget)
                    )
                } else {
                    format!("at most {} models", self.limits.max_loaded)
                };
                return Err(PoolError::Busy {
                    model: model.name.clone(),
                    busy,
                    room,
                });
            }
            slots = self
                .changed
                .wait_timeout(slots, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        slots.loading = true;
        drop(slots);
        tracing::info!(model = %model.name, "loading");
        let started = self.starter.start(model);
        let mut slots = self.lock();
        slots.loading = false;
        self.changed.notify_all();
        let engine = started.map_err(|source| PoolError::Load {
            model: model.name.clone(),
            source,
        })?;
        slots.device = Some(engine.device());
        let loaded = Arc::new(LoadedModel {
            model: model.clone(),
            engine,
        });
        slots.slots.push(Slot {
            loaded: Arc::clone(&loaded),
            users: 1,
            expires_at: None,
            last_used: Instant::now(),
            file_size: need,
        });
        Ok(ModelUse {
            pool: Arc::clone(self),
            loaded,
            keep_alive,
            asked: model.clone(),
        })
    }

    fn fits(&self, slots: &Slots, need: u64) -> bool {
        let budget = self.limits.memory_budget;
        let used: u64 = slots.slots.iter().map(Slot::size).sum();
        slots.slots.len() < self.limits.max_loaded.max(1) && (budget == 0 || used + need <= budget)
    }

    /// Takes idle models out, least recently used first, until `need` fits
    /// (or no idle model is left). Returns them, to be shut down unlocked.
    fn make_room(&self, slots: &mut Slots, need: u64) -> Vec<Arc<LoadedModel>> {
        let mut evicted = Vec::new();
        while !self.fits(slots, need) {
            let Some(oldest) = slots
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.users == 0)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i)
            else {
                break;
            };
            let slot = slots.slots.remove(oldest);
            tracing::info!(model = %slot.loaded.model.name, "unloading to make room");
            add_counters(&mut slots.retired, &slot.loaded.engine.stats());
            evicted.push(slot.loaded);
        }
        evicted
    }

    fn release(&self, loaded: &Arc<LoadedModel>, keep_alive: Option<KeepAlive>) {
        let mut slots = self.lock();
        let expiry = self.expiry(keep_alive);
        let mut gone = None;
        if let Some(i) = slots
            .slots
            .iter()
            .position(|s| Arc::ptr_eq(&s.loaded, loaded))
        {
            let slot = &mut slots.slots[i];
            slot.users -= 1;
            slot.last_used = Instant::now();
            slot.expires_at = expiry;
            if slot.users == 0 && expiry.is_some_and(|at| at <= SystemTime::now()) {
                let slot = slots.slots.remove(i);
                tracing::info!(model = %slot.loaded.model.name, "unloading (keep_alive 0)");
                add_counters(&mut slots.retired, &slot.loaded.engine.stats());
                gone = Some(slot.loaded);
            }
        }
        self.changed.notify_all();
        drop(slots);
        drop(gone);
    }

    /// Unloads the idle models whose keep-alive ran out; the server calls it
    /// every second.
    pub(crate) fn unload_expired(&self) {
        let now = SystemTime::now();
        let mut slots = self.lock();
        let mut gone = Vec::new();
        let mut kept = Vec::new();
        for slot in std::mem::take(&mut slots.slots) {
            if slot.users == 0 && slot.expires_at.is_some_and(|at| at <= now) {
                tracing::info!(model = %slot.loaded.model.name, "unloading (keep_alive ran out)");
                gone.push(slot);
            } else {
                kept.push(slot);
            }
        }
        slots.slots = kept;
        for slot in &gone {
            add_counters(&mut slots.retired, &slot.loaded.engine.stats());
        }
        if !gone.is_empty() {
            self.changed.notify_all();
        }
        drop(slots);
        drop(gone);
    }

    /// Unloads the model with this SHA-256 if it is idle (Ollama's
    /// `keep_alive: 0` with no prompt); whether it is gone now.
    pub(crate) fn unload(&self, sha256: &str) -> bool {
        let mut slots = self.lock();
        let Some(i) = slots
            .slots
            .iter()
            .position(|s| s.loaded.model.sha256 == sha256)
        else {
            return true;
        };
        if slots.slots[i].users > 0 {
            // It goes when its last request ends.
            slots.slots[i].expires_at = Some(SystemTime::now());
            return false;
        }
        let slot = slots.slots.remove(i);
        add_counters(&mut slots.retired, &slot.loaded.engine.stats());
        self.changed.notify_all();
        drop(slots);
        drop(slot);
        true
    }

    /// The loaded models, most recently used first.
    pub(crate) fn running(&self) -> Vec<Running> {
        let slots = self.lock();
        let mut running: Vec<(&Slot, Running)> = slots
            .slots
            .iter()
            .map(|s| {
                let on_gpu = s.loaded.engine.gpu_memory_used().unwrap_or(0);
                (
                    s,
                    Running {
                        model: s.loaded.model.clone(),
                        size: s.size().max(on_gpu),
                        size_vram: on_gpu,
                        expires_at: if s.users > 0 {
                            // In use: it stays at least its keep-alive from now.
                            self.expiry(None)
                        } else {
                            s.expires_at
                        },
                    },
                )
            })
            .collect();
        running.sort_by_key(|(s, _)| std::cmp::Reverse(s.last_used));
        running.into_iter().map(|(_, r)| r).collect()
    }

    /// Every engine's totals, unloaded ones included (counters never go
    /// back), with the gauges of the loaded ones.
    pub(crate) fn stats(&self) -> EngineStats {
        let slots = self.lock();
        let mut total = slots.retired;
        total.running = 0;
        total.waiting = 0;
        total.kv_utilisation = 0.0;
        for slot in &slots.slots {
            let stats = slot.loaded.engine.stats();
            add_counters(&mut total, &stats);
            total.running += stats.running;
            total.waiting += stats.waiting;
            total.kv_bytes += stats.kv_bytes;
            total.kv_utilisation = total.kv_utilisation.max(stats.kv_utilisation);
        }
        total
    }

    /// The device the models run on, and the memory of it in use for them.
    pub(crate) fn device(&self) -> (Option<Device>, u64) {
        let slots = self.lock();
        let used = match slots.slots.first() {
            Some(first) if first.loaded.engine.gpu_memory_used().is_none() => {
                first.loaded.engine.device_memory_used()
            }
            _ => slots
                .slots
                .iter()
                .filter_map(|s| s.loaded.engine.gpu_memory_used())
                .sum(),
        };
        (slots.device.clone(), used)
    }

    /// Running unless a loaded engine stopped or died.
    pub(crate) fn health(&self) -> EngineHealth {
        let slots = self.lock();
        for slot in &slots.slots {
            match slot.loaded.engine.health() {
                EngineHealth::Running => {}
                other => return other,
            }
        }
        EngineHealth::Running
    }

    /// Cancels these requests in whichever engine has them.
    pub(crate) fn cancel(&self, ids: &[cortex_request::RequestId]) {
        let loaded: Vec<Arc<LoadedModel>> = self
            .lock()
            .slots
            .iter()
            .map(|s| Arc::clone(&s.loaded))
            .collect();
        for model in loaded {
            for id in ids {
                model.engine.cancel(*id);
            }
        }
    }

    /// Every loaded model goes (server shutdown).
    pub(crate) fn unload_all(&self) {
        let gone = std::mem::take(&mut self.lock().slots);
        drop(gone);
    }
}

#[cfg(test)]
mod tests {
    use cortex_engine::fake::FakeExecutor;

    use super::*;

    fn fake_engine() -> Result<Engine, EngineError> {
        Engine::start_with_executor(
            cortex_engine::EngineConfig::for_fake_executor(1, 16),
            move || Ok::<_, EngineError>(FakeExecutor::new()),
        )
    }

    /// A model whose file has `bytes` bytes.
    fn model(dir: &std::path::Path, name: &str, bytes: usize) -> ModelIdentity {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, vec![0u8; bytes]).unwrap();
        ModelIdentity {
            path,
            name: format!("{name}:latest"),
            sha256: format!("{name:0>64}"),
            settings: cortex_models::ModelSettings::default(),
        }
    }

    fn pool(dir: &std::path::Path, limits: PoolLimits) -> (Arc<ModelPool>, ModelIdentity) {
        let default = model(dir, "a", 1000);
        let pool = ModelPool::new(
            Registry::open(dir.join("registry")),
            default.clone(),
            fake_engine().unwrap(),
            EngineStarter::new(|_| fake_engine()),
            limits,
        );
        (pool, default)
    }

    fn loaded(pool: &ModelPool) -> Vec<String> {
        pool.running().into_iter().map(|r| r.model.name).collect()
    }

    #[test]
    fn a_model_in_use_is_never_unloaded_and_an_idle_one_makes_room() {
        let dir = tempfile::tempdir().unwrap();
        let limits = PoolLimits {
            max_loaded: 1,
            load_wait: Duration::from_millis(200),
            ..PoolLimits::default()
        };
        let (pool, a) = pool(dir.path(), limits);
        let b = model(dir.path(), "b", 1000);
        let held = pool.acquire(&a, None).unwrap();
        let refused = pool.acquire(&b, None).err().unwrap();
        assert!(
            matches!(&refused, PoolError::Busy { busy, .. } if busy == &["a:latest"]),
            "{refused}"
        );
        drop(held);
        let b_held = pool.acquire(&b, None).unwrap();
        assert_eq!(loaded(&pool), ["b:latest"]);
        // keep_alive 0: gone as soon as its last use ends.
        let last = pool
            .acquire(&b, Some(KeepAlive::For(Duration::ZERO)))
            .unwrap();
        drop(b_held);
        assert_eq!(loaded(&pool), ["b:latest"], "still in use");
        drop(last);
        assert!(loaded(&pool).is_empty(), "{:?}", loaded(&pool));
    }

    #[test]
    fn keep_alive_runs_out_and_a_model_over_the_budget_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let limits = PoolLimits {
            keep_alive: KeepAlive::For(Duration::from_millis(50)),
            memory_budget: 10_000,
            ..PoolLimits::default()
        };
        let (pool, a) = pool(dir.path(), limits);
        drop(pool.acquire(&a, Some(KeepAlive::Forever)).unwrap());
        std::thread::sleep(Duration::from_millis(80));
        pool.unload_expired();
        assert_eq!(loaded(&pool), ["a:latest"], "kept for ever");
        drop(pool.acquire(&a, None).unwrap());
        std::thread::sleep(Duration::from_millis(80));
        pool.unload_expired();
        assert!(loaded(&pool).is_empty());
        let huge = model(dir.path(), "huge", 20_000);
        let refused = pool.acquire(&huge, None).err().unwrap();
        assert!(matches!(refused, PoolError::TooLarge { .. }), "{refused}");
        // The default loads again on demand, and its counters were kept.
        drop(pool.acquire(&a, None).unwrap());
        assert_eq!(loaded(&pool), ["a:latest"]);
    }

    #[test]
    fn keep_alive_reads_durations_and_prints_them_back() {
        for text in ["5m", "1h", "90s", "500ms", "0", "-1"] {
            let value: KeepAlive = text.parse().unwrap();
            assert_eq!(value.to_string(), text);
        }
        assert_eq!(
            "1h30m".parse(),
            Ok(KeepAlive::For(Duration::from_secs(5400)))
        );
        assert_eq!("-1m".parse(), Ok(KeepAlive::Forever));
        assert_eq!(KeepAlive::from_seconds(-1.0), KeepAlive::Forever);
        for bad in ["soon", "5 minutes", "1e999"] {
            assert!(bad.parse::<KeepAlive>().is_err(), "{bad}");
        }
    }
}
