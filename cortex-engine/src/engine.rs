//! The engine handle: starts the step loop on a thread of its own and talks
//! to it over channels.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use cortex_request::{EmbeddingRequest, Request, RequestId, TokenId, Work};

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::events::{EngineStats, StepObserver};
use crate::executor::Executor;
use crate::placement::{Device, ModelPlacement};
use crate::protocol::{
    Command, EngineHealth, EngineInfo, EventReceiver, EventSender, Shared, Shutdown, event_channel,
    panic_message,
};
use crate::step::StepLoop;

/// A running engine: step loops on threads of their own, driven over
/// channels.
///
/// Submit a [`Request`] and receive its [`EngineEvent`](crate::EngineEvent)s; cancel at any time;
/// read [`EngineStats`]; ask [`Engine::available_slots`] to keep it full;
/// [`Engine::health`] tells whether the loops are alive; [`Engine::shutdown`]
/// draining or aborting. Dropping it aborts.
///
/// On a GPU several step loops share the device (see
/// [`EngineConfig::step_loops`]), each with its own KV cache and sequences:
/// while one waits for the device, another plans, samples and streams. The
/// handle gives each request to the loop with the fewest in hand.
pub struct Engine {
    lanes: Vec<Lane>,
    info: EngineInfo,
    /// Where the model is (set once it loaded; unset over a fake executor:
    /// the CPU).
    placement: Arc<OnceLock<Arc<dyn ModelPlacement>>>,
    thread: Option<JoinHandle<()>>,
}

/// The handle's side of one step loop.
struct Lane {
    commands: flume::Sender<Command>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", &self.info)
            .field("step_loops", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

/// The engine thread's side of [`Engine::launch`]: where the model is, and
/// the loops to run.
pub struct Launch<'a> {
    placement: &'a OnceLock<Arc<dyn ModelPlacement>>,
    runner: &'a mut dyn for<'b> FnMut(&EngineConfig, Executors<'b>),
}

/// One executor per step loop, each borrowing for `'b` what was loaded for
/// them.
type Executors<'b> = Vec<Box<dyn Executor + Send + 'b>>;

impl Launch<'_> {
    /// Says where the model is, for [`Engine::device`],
    /// [`Engine::cortex_kernels`] and [`Engine::gpu_memory_used`] (unsaid:
    /// the CPU).
    pub fn place(&self, placement: Arc<dyn ModelPlacement>) {
        let _ = self.placement.set(placement);
    }

    /// Makes a step loop per executor, each with `config`'s settings (a loop's
    /// share, see [`EngineConfig::per_loop`]), reports the engine ready and
    /// runs the loops until they stop.
    pub fn run(self, config: &EngineConfig, executors: Executors<'_>) {
        (self.runner)(config, executors);
    }
}

/// What the engine thread hands back once its loops are ready.
type Ready = Result<(Vec<Lane>, EngineInfo), EngineError>;

impl Engine {
    /// Starts an engine on a thread of its own: `body` runs there, loads
    /// what the executors need (a model, which they may borrow), says where
    /// it is ([`Launch::place`]) and hands one executor per step loop to
    /// [`Launch::run`], which reports the engine ready and runs the loops
    /// until they stop. Returns once the loops are ready, or with the error
    /// `body` returned (or the first loop's that could not start).
    ///
    /// This is how a binding starts an engine over its library
    /// (`cortex_llama::start`); `observer`, if any, hears every step.
    pub fn launch<F>(observer: Option<Box<dyn StepObserver>>, body: F) -> Result<Self, EngineError>
    where
        F: FnOnce(Launch<'_>) -> Result<(), EngineError> + Send + 'static,
    {
        let placement: Arc<OnceLock<Arc<dyn ModelPlacement>>> = Arc::new(OnceLock::new());
        let placed = Arc::clone(&placement);
        let (ready_tx, ready_rx) = flume::bounded::<Ready>(1);
        let thread = std::thread::Builder::new()
            .name("cortex-engine".into())
            .spawn(move || {
                let ready_for_error = ready_tx.clone();
                let mut observer = observer;
                let mut runner = |config: &EngineConfig, executors: Executors<'_>| {
                    run_loops(config, executors, observer.take(), &ready_tx);
                };
                let launch = Launch {
                    placement: &placed,
                    runner: &mut runner,
                };
                if let Err(e) = body(launch) {
                    let _ = ready_for_error.send(Err(e));
                }
            })
            .map_err(|e| EngineError::Model(format!("cannot start the engine thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((lanes, info))) => Ok(Self {
                lanes,
                info,
                placement,
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

    /// Starts one loop over an executor made by `make` on the engine thread,
    /// sized as for the CPU: for tests of the loop, the worker and the
    /// server over a fake executor (failure injection, scheduling).
    #[cfg(any(test, feature = "test-support"))]
    pub fn start_with_executor<B, F>(config: EngineConfig, make: F) -> Result<Self, EngineError>
    where
        B: Executor + Send,
        F: FnOnce() -> Result<B, EngineError> + Send + 'static,
    {
        Self::launch(None, move |launch| {
            let executor = make()?;
            let mut config = config.for_device(crate::config::ComputedOn::Cpu);
            config.step_loops = 1;
            launch.run(&config, vec![Box::new(executor)]);
            Ok(())
        })
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
            .map_or_else(Device::host, |placement| placement.device())
    }

    /// The instruction set cortex's own CPU kernels run with in this engine
    /// (`AVX-512 VNNI`, `AVX-VNNI`, `AVX2`); `None` when llama.cpp's kernels do all the
    /// work (`--cpu-kernels llama`, a model wholly on a GPU, a CPU without
    /// AVX2).
    pub fn cortex_kernels(&self) -> Option<&'static str> {
        self.placement.get()?.cortex_kernels()
    }

    /// Whether a line's output here depends only on the line, its settings
    /// and its seed, whatever runs beside it; `false` where unsaid (a fake
    /// executor).
    pub fn same_output(&self) -> bool {
        self.placement.get().is_some_and(|p| p.same_output())
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

    /// Gives each request to the accepting loop with the fewest in hand.
    fn send_many(&self, pairs: Vec<(Work, EventSender)>) -> Result<(), EngineError> {
        let accepting: Vec<&Lane> = self
            .lanes
            .iter()
            .filter(|lane| lane.shared.accepting.load(Ordering::SeqCst))
            .collect();
        if accepting.is_empty() {
            return Err(self.refusal());
        }
        let mut load: Vec<usize> = accepting
            .iter()
            .map(|lane| lane.shared.in_flight.load(Ordering::SeqCst))
            .collect();
        let mut shares: Vec<Vec<(Work, EventSender)>> =
            accepting.iter().map(|_| Vec::new()).collect();
        for pair in pairs {
            let least = (0..load.len())
                .min_by_key(|&i| load[i])
                .expect("a lane accepts");
            load[least] += 1;
            shares[least].push(pair);
        }
        for (lane, share) in accepting.into_iter().zip(shares) {
            if share.is_empty() {
                continue;
            }
            let count = share.len();
            lane.shared.in_flight.fetch_add(count, Ordering::SeqCst);
            if lane.commands.send(Command::Submit(share)).is_err() {
                lane.shared.in_flight.fetch_sub(count, Ordering::SeqCst);
                return Err(self.refusal());
            }
        }
        Ok(())
    }

    /// Why a request cannot be taken: a loop died, or they stopped.
    fn refusal(&self) -> EngineError {
        match self.health() {
            EngineHealth::Died(message) => EngineError::Died(message),
            _ => EngineError::Stopped,
        }
    }

    /// `text`'s tokens as a prompt's are made (special tokens such as
    /// `<|im_end|>` parsed), after the model's start token when
    /// `add_special` and the model uses one.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, EngineError> {
        let text = text.to_owned();
        self.ask(move |executor| executor.tokenize(&text, add_special, true))
    }

    /// The text `tokens` stand for (control tokens render as nothing; ids
    /// outside the vocabulary, which [`EngineInfo::n_vocab`] bounds, as
    /// nothing too).
    pub fn detokenize(&self, tokens: Vec<TokenId>) -> Result<String, EngineError> {
        let n_vocab = self.info.n_vocab;
        self.ask(move |executor| {
            let bytes: Vec<u8> = tokens
                .iter()
                .filter(|&&t| (t as usize) < n_vocab)
                .flat_map(|&t| executor.token_bytes(t))
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
    }

    /// The texts of the model's start and end tokens (empty where it has
    /// none).
    pub fn start_end_texts(&self) -> Result<(String, String), EngineError> {
        self.ask(|executor| executor.start_end_texts())
    }

    /// Runs `query` against a step loop's executor between its steps.
    fn ask<R: Send + 'static>(
        &self,
        query: impl FnOnce(&dyn Executor) -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        let (tx, rx) = flume::bounded(1);
        let command = Command::Vocabulary(Box::new(move |executor| {
            let _ = tx.send(query(executor));
        }));
        let lane = self.lanes.first().ok_or(EngineError::Stopped)?;
        if lane.commands.send(command).is_err() {
            return Err(self.refusal());
        }
        rx.recv().map_err(|_| self.refusal())
    }

    /// Cancels a request wherever it is; it finishes with reason `cancelled`.
    /// Unknown ids are ignored (the request may have just finished).
    pub fn cancel(&self, id: RequestId) {
        // The loop that holds it acts; the others know no such request.
        for lane in &self.lanes {
            let _ = lane.commands.send(Command::Cancel(id));
        }
    }

    /// A snapshot of the counters, over every step loop.
    pub fn stats(&self) -> EngineStats {
        let each: Vec<EngineStats> = self
            .lanes
            .iter()
            .map(|lane| {
                *lane
                    .shared
                    .stats
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            })
            .collect();
        EngineStats::combined(&each)
    }

    /// Whether the step loops are alive, stopped, or one died (and why).
    pub fn health(&self) -> EngineHealth {
        let mut health = EngineHealth::Stopped;
        for lane in &self.lanes {
            let lane_health = lane
                .shared
                .health
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            match lane_health {
                died @ EngineHealth::Died(_) => return died,
                EngineHealth::Running => health = EngineHealth::Running,
                EngineHealth::Stopped => {}
            }
        }
        health
    }

    /// Requests submitted and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.lanes
            .iter()
            .map(|lane| lane.shared.in_flight.load(Ordering::SeqCst))
            .sum()
    }

    /// How many more requests to submit now to keep the engine busy: enough
    /// to fill every running slot once more, so a waiting request is always at
    /// hand when one finishes.
    pub fn available_slots(&self) -> usize {
        (self.info.parallel * 2).saturating_sub(self.in_flight())
    }

    /// Stops the engine and waits for its thread. Returns how it ended: `Ok`
    /// after a clean stop, [`EngineError::Died`] if a loop had died.
    pub fn shutdown(mut self, mode: Shutdown) -> Result<(), EngineError> {
        self.stop(mode)
    }

    fn stop(&mut self, mode: Shutdown) -> Result<(), EngineError> {
        for lane in &self.lanes {
            lane.shared.accepting.store(false, Ordering::SeqCst);
            let _ = lane.commands.send(Command::Shutdown(mode));
        }
        if let Some(thread) = self.thread.take()
            && let Err(panic) = thread.join()
        {
            // The loops catch their own panics; this is one outside them.
            let message = panic_message(panic.as_ref());
            for lane in &self.lanes {
                lane.shared.set_health(EngineHealth::Died(message.clone()));
            }
        }
        match self.health() {
            EngineHealth::Died(message) => Err(EngineError::Died(message)),
            _ => {
                for lane in &self.lanes {
                    lane.shared.set_health(EngineHealth::Stopped);
                }
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

/// Makes a step loop per executor, reports them ready (or the first error)
/// and runs them to their end: one on this thread, several on scoped
/// threads of their own. `observer`, if any, hears every loop's steps.
fn run_loops(
    config: &EngineConfig,
    executors: Executors<'_>,
    observer: Option<Box<dyn StepObserver>>,
    ready: &flume::Sender<Ready>,
) {
    let count = executors.len();
    let observer = observer.map(|o| Arc::new(std::sync::Mutex::new(o)));
    let mut loops = Vec::with_capacity(count);
    let mut lanes = Vec::with_capacity(count);
    for (index, executor) in executors.into_iter().enumerate() {
        let (commands, receiver) = flume::unbounded();
        let shared = Arc::new(Shared::new());
        let watcher = observer.as_ref().map(|o| {
            Box::new(SharedObserver {
                inner: Arc::clone(o),
                step_loop: index,
            }) as Box<dyn StepObserver>
        });
        match StepLoop::new(executor, config, receiver, Arc::clone(&shared), watcher) {
            Ok(step_loop) => {
                loops.push(step_loop);
                lanes.push(Lane { commands, shared });
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        }
    }
    let infos: Vec<EngineInfo> = loops.iter().map(StepLoop::info).collect();
    let _ = ready.send(Ok((lanes, EngineInfo::combined(&infos))));
    if let [only] = loops.as_mut_slice() {
        only.run_guarded();
        return;
    }
    std::thread::scope(|scope| {
        for (index, step_loop) in loops.iter_mut().enumerate() {
            let spawned = std::thread::Builder::new()
                .name(format!("cortex-loop-{index}"))
                .spawn_scoped(scope, move || step_loop.run_guarded());
            if let Err(e) = spawned {
                tracing::error!("cannot start step loop {index}: {e}");
            }
        }
    });
}

/// One observer heard by several loops, each step tagged with its loop.
struct SharedObserver {
    inner: Arc<std::sync::Mutex<Box<dyn StepObserver>>>,
    step_loop: usize,
}

impl StepObserver for SharedObserver {
    fn step(&mut self, record: &crate::StepRecord) {
        let mut record = *record;
        record.step_loop = self.step_loop;
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .step(&record);
    }

    fn prompt(&mut self, tokens: &[TokenId]) {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .prompt(tokens);
    }
}
