//! The engine handle: starts the step loop on a thread of its own and talks
//! to it over channels.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use cortex_request::{EmbeddingRequest, Request, RequestId, Work};

use crate::backend::Backend;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::events::{EngineStats, StepObserver};
use crate::llama::Device;
use crate::llama::{ContextConfig, LlamaEngineBackend, Placement};
use crate::protocol::{
    Command, EngineHealth, EngineInfo, EventReceiver, EventSender, Shared, Shutdown, event_channel,
    panic_message,
};
use crate::step::StepLoop;

/// A running engine: a step loop on its own thread, driven over channels.
///
/// Submit a [`Request`] and receive its [`EngineEvent`](crate::EngineEvent)s; cancel at any time;
/// read [`EngineStats`]; ask [`Engine::available_slots`] to keep it full;
/// [`Engine::health`] tells whether the loop is alive; [`Engine::shutdown`]
/// draining or aborting. Dropping it aborts.
pub struct Engine {
    commands: flume::Sender<Command>,
    shared: Arc<Shared>,
    info: EngineInfo,
    /// Where the model is (set once it loaded; unset over a fake backend:
    /// the CPU).
    placement: Arc<OnceLock<Placement>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Loads the model with llama.cpp and starts the loop. Returns once the
    /// model is loaded, or with the reason it could not be.
    pub fn start(config: &EngineConfig) -> Result<Self, EngineError> {
        Self::start_observed(config, None)
    }

    /// [`Engine::start`], with `observer` told of every step and prompt (a
    /// trace of where a job's time goes).
    pub fn start_observed(
        config: &EngineConfig,
        observer: Option<Box<dyn StepObserver>>,
    ) -> Result<Self, EngineError> {
        let context = ContextConfig {
            max_batch_tokens: config.max_batch_tokens.max(config.parallel),
            threads: config.effective_threads(),
        };
        let chat_template = config
            .chat_template
            .as_deref()
            .map(crate::llama::resolve_chat_template)
            .transpose()?;
        let placement = Arc::new(OnceLock::new());
        let placed = Arc::clone(&placement);
        let load = config.clone();
        let mut engine = Self::spawn(config.clone(), observer, move |run| {
            let model = load.load_model()?;
            let _ = placed.set(model.placement());
            let mut backend = LlamaEngineBackend::new(&model, context, &load.model);
            if let Some(template) = chat_template {
                backend = backend
                    .with_chat_template(&template)
                    .map_err(|e| EngineError::Model(e.to_string()))?;
            }
            run(Box::new(backend));
            Ok(())
        })?;
        engine.placement = placement;
        Ok(engine)
    }

    /// Starts the loop over a backend made by `make` on the engine thread.
    // Hidden: for the engine's tests over a fake backend (failure injection,
    // scheduling); applications start an engine from an `EngineConfig`.
    #[doc(hidden)]
    pub fn start_with_backend<B, F>(config: EngineConfig, make: F) -> Result<Self, EngineError>
    where
        B: Backend,
        F: FnOnce() -> Result<B, EngineError> + Send + 'static,
    {
        Self::spawn(config, None, move |run| {
            let backend = make()?;
            run(Box::new(backend));
            Ok(())
        })
    }

    /// Spawns the engine thread. `body` builds a backend (borrowing whatever it
    /// loads on that thread) and hands it to the loop runner it is given.
    fn spawn<F>(
        config: EngineConfig,
        observer: Option<Box<dyn StepObserver>>,
        body: F,
    ) -> Result<Self, EngineError>
    where
        F: FnOnce(&mut dyn FnMut(Box<dyn Backend + '_>)) -> Result<(), EngineError>
            + Send
            + 'static,
    {
        let (commands, receiver) = flume::unbounded();
        let (ready_tx, ready_rx) = flume::bounded::<Result<EngineInfo, EngineError>>(1);
        let shared = Arc::new(Shared::new());
        let loop_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("cortex-engine".into())
            .spawn(move || {
                let ready_for_error = ready_tx.clone();
                let mut observer = observer;
                let mut runner = |backend: Box<dyn Backend + '_>| match StepLoop::new(
                    backend,
                    &config,
                    receiver.clone(),
                    Arc::clone(&loop_shared),
                    observer.take(),
                ) {
                    Ok(mut step_loop) => {
                        let _ = ready_tx.send(Ok(step_loop.info()));
                        step_loop.run_guarded();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                };
                if let Err(e) = body(&mut runner) {
                    let _ = ready_for_error.send(Err(e));
                }
            })
            .map_err(|e| EngineError::Model(format!("cannot start the engine thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(info)) => Ok(Self {
                commands,
                shared,
                info,
                placement: Arc::new(OnceLock::new()),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(EngineError::Stopped)
            }
        }
    }

    /// Model and context facts.
    pub fn info(&self) -> EngineInfo {
        self.info
    }

    /// The device that holds the model and its KV cache, with its memory
    /// as it is now.
    pub fn device(&self) -> Device {
        self.placement
            .get()
            .copied()
            .unwrap_or_else(Placement::cpu)
            .device()
    }

    /// The instruction set cortex's own CPU kernels run with in this engine
    /// (`AVX-512 VNNI`, `AVX2`); `None` when llama.cpp's kernels do all the
    /// work (`--cpu-kernels llama`, a model wholly on a GPU, a CPU without
    /// AVX2).
    pub fn cortex_kernels(&self) -> Option<&'static str> {
        self.placement.get().and_then(Placement::cortex_kernels)
    }

    /// Bytes of the GPU's memory this engine has taken (weights, KV cache,
    /// llama.cpp's buffers), read now; `None` when it runs on the CPU.
    pub fn gpu_memory_used(&self) -> Option<u64> {
        let kv_bytes = self.stats().kv_bytes;
        self.placement.get()?.gpu_memory_used(kv_bytes)
    }

    /// Bytes of its device's memory in use for this engine now: on a GPU
    /// what it has taken there, on the CPU this process's resident memory.
    pub fn device_memory_used(&self) -> u64 {
        self.gpu_memory_used()
            .unwrap_or_else(|| crate::system::resident_memory().unwrap_or(0) as u64)
    }

    /// Submits a request; its events arrive on the returned receiver, ending
    /// with `Finished` or `Failed`.
    pub fn submit(&self, request: Request) -> Result<EventReceiver, EngineError> {
        let (tx, rx) = event_channel();
        self.submit_to(request, tx)?;
        Ok(rx)
    }

    /// Submits a request whose events go to `events` (one channel can serve
    /// many requests; events carry the request id).
    pub fn submit_to(&self, request: Request, events: EventSender) -> Result<(), EngineError> {
        self.send_many(vec![(Work::Generate(request), events)])
    }

    /// Submits an embedding request; its one event is `Finished` (with
    /// [`cortex_request::Response::embeddings`]) or `Failed`. Inputs of
    /// many requests are computed together, up to
    /// [`crate::EMBED_SEQUENCES`] per decode, between generation steps.
    /// Embedding requests run to the end: cancelling one changes nothing.
    pub fn embed(&self, request: EmbeddingRequest) -> Result<EventReceiver, EngineError> {
        let (tx, rx) = event_channel();
        self.send_many(vec![(Work::Embed(request), tx)])?;
        Ok(rx)
    }

    /// Submits several requests that reach the engine together, before its
    /// next step (so a batch is scheduled the same way every time).
    pub fn submit_many(&self, requests: Vec<Request>) -> Result<Vec<EventReceiver>, EngineError> {
        let (pairs, receivers): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|request| {
                let (tx, rx) = event_channel();
                ((request, tx), rx)
            })
            .unzip();
        self.send_many(
            pairs
                .into_iter()
                .map(|(r, tx)| (Work::Generate(r), tx))
                .collect(),
        )?;
        Ok(receivers)
    }

    /// Submits generation and embedding requests together (see
    /// [`Engine::submit_many`] and [`Engine::embed`]), every event going to
    /// one channel.
    pub fn submit_many_to(
        &self,
        requests: Vec<Work>,
        events: &EventSender,
    ) -> Result<(), EngineError> {
        self.send_many(requests.into_iter().map(|r| (r, events.clone())).collect())
    }

    fn send_many(&self, pairs: Vec<(Work, EventSender)>) -> Result<(), EngineError> {
        if !self.shared.accepting.load(Ordering::SeqCst) {
            return Err(self.refusal());
        }
        let count = pairs.len();
        self.shared.in_flight.fetch_add(count, Ordering::SeqCst);
        self.commands.send(Command::Submit(pairs)).map_err(|_| {
            self.shared.in_flight.fetch_sub(count, Ordering::SeqCst);
            self.refusal()
        })
    }

    /// Why a request cannot be taken: the loop died, or it stopped.
    fn refusal(&self) -> EngineError {
        match self.health() {
            EngineHealth::Died(message) => EngineError::Died(message),
            _ => EngineError::Stopped,
        }
    }

    /// Cancels a request wherever it is; it finishes with reason `cancelled`.
    /// Unknown ids are ignored (the request may have just finished).
    pub fn cancel(&self, id: RequestId) {
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EngineStats {
        *self
            .shared
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the step loop is alive, stopped, or died (and why).
    pub fn health(&self) -> EngineHealth {
        self.shared
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Requests submitted and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// How many more requests to submit now to keep the engine busy: enough
    /// to fill every running slot once more, so a waiting request is always at
    /// hand when one finishes.
    pub fn available_slots(&self) -> usize {
        (self.info.parallel * 2).saturating_sub(self.in_flight())
    }

    /// Stops the engine and waits for its thread. Returns how it ended: `Ok`
    /// after a clean stop, [`EngineError::Died`] if the loop had died.
    pub fn shutdown(mut self, mode: Shutdown) -> Result<(), EngineError> {
        self.stop(mode)
    }

    fn stop(&mut self, mode: Shutdown) -> Result<(), EngineError> {
        self.shared.accepting.store(false, Ordering::SeqCst);
        let _ = self.commands.send(Command::Shutdown(mode));
        if let Some(thread) = self.thread.take()
            && let Err(panic) = thread.join()
        {
            // The loop catches its own panics; this is one outside it.
            let message = panic_message(panic.as_ref());
            self.shared.set_health(EngineHealth::Died(message.clone()));
        }
        match self.health() {
            EngineHealth::Died(message) => Err(EngineError::Died(message)),
            _ => {
                self.shared.set_health(EngineHealth::Stopped);
                Ok(())
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.stop(Shutdown::Abort);
    }
}
