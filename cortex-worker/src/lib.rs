//! The cortex worker as a library: the bridge between a durable queue
//! (a [`cortex_queue::Queue`], such as `cortex_queue_sqlite::Store`) and an engine ([`cortex_engine::Engine`]), and
//! model identity (which GGUF, and its SHA-256 that binds jobs to it).
//!
//! The `cortex worker` and `cortex run` commands are thin shells around
//! [`run_worker`]; a server runs the same function on its own thread.
//!
//! What a worker guarantees:
//! - an item's result is written at most once, under its lease;
//! - items in flight when a worker (or its engine) dies lose no attempt
//!   unless they ran alone: they come back as suspects, in ever smaller
//!   groups run with nothing else beside them, until the one that kills
//!   workers runs alone and is charged for the deaths it causes in a row
//!   (at most one lone suspect per worker life, never its first claim);
//! - it claims only jobs for its model ([`WorkerPlan::model_sha256`]); a
//!   worker without a model of its own ([`work_in_turns`] over
//!   [`OneModelAtATime`]) loads each job's model from the registry in turn,
//!   one at a time; a server's queue worker runs the same rotation over its
//!   model pool (an [`EngineSource`] of `cortex-server`'s).
//!
//! # Example
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//!
//! use cortex_models::Registry;
//! use cortex_queue_sqlite::Store;
//! use cortex_worker::{WorkerPlan, resolve, run_worker};
//!
//! let model = resolve("default", &Registry::default_location())?;
//! let engine = cortex_llama::start(&cortex_engine::EngineConfig::new(&model.path))?;
//! let mut store = Store::open("cortex.db")?;
//! let mut plan = WorkerPlan::new(Duration::from_secs(60));
//! plan.model_sha256 = Some(model.sha256);
//! let report = run_worker(&mut store, engine, &plan, &AtomicBool::new(false), |_| Ok(()))?;
//! println!("{} completed", report.completed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design notes
//!
//! The worker as a library (the CLI's `worker` and `run`, and the server,
//! call it). `model.rs`: a model setting becomes a `ModelIdentity` (path,
//! name, SHA-256, settings) through the registry; `identify` gives it without
//! fetching, for submit; `model_defaults` turns a model's settings into a
//! job's `JobDefaults` (its `SYSTEM` for chats without one, its parameters);
//! `jobs_needing` lists the unfinished jobs bound to a digest (what `models rm`
//! refuses to break). `rotation.rs`: `work_in_turns`, the one rotation over
//! models (a worker without a model of its own, a server's queue worker),
//! takes from its `EngineSource` the model of the oldest job with pending items
//! (by digest, from the registry; with nothing pending, a model whose jobs
//! are unfinished, since items under a dead worker's leases come back only
//! through a claim for their model), works its jobs with `work_queue` while
//! looking at the others every 2 s, and hands over (`WorkerPlan::hand_over`:
//! claim nothing more, return when the items in flight end) when its model's
//! pending items run out or another model's job has waited `switch_after`
//! and its own turn has lasted as long; a model its source cannot run now
//! (`HoldError::Unavailable`) is left out for a minute. `queue_loop.rs`: `run_worker(store,
//! engine, plan, stop, tick)` claims as many items as the engine has free
//! slots (`available_slots`; suspects only into an idle engine, and then
//! nothing more until they finish), submits them on one event channel, writes
//! every result that finished in a round with one `complete_many` (one
//! commit), failures with the engine error's code and retryability, heartbeats
//! every third of the lease (a lost lease or a cancelled job cancels the
//! request in the engine). If the engine dies (a `Died` event or
//! `Engine::health`), its in-flight items are `abandon`ed with the panic
//! message and the run returns `WorkerError::EngineDied`. It returns when no
//! job in scope (and for its model) can produce work, or on `stop`: in-flight
//! items get 3 s, the rest are released (pending again, attempt not used).
//! `work_queue` is the same loop on an engine others use too (the server's):
//! it borrows the engine and leaves it running; `WorkerPlan::parallel` (read before every claim, so another thread may change it)
//! caps the items it keeps in the engine.

#![forbid(unsafe_code)]

mod model;
mod queue_loop;
mod rotation;

pub use model::{ModelIdentity, identify, jobs_needing, model_defaults, resolve};
pub use queue_loop::{WorkerPlan, WorkerReport, run_worker, work_queue};
pub use rotation::{
    DEFAULT_MODEL_SWITCH, EngineSource, HoldError, ModelDemand, OneModelAtATime, work_in_turns,
};

/// Why a worker could not go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The queue failed (database error, disk full, ...).
    #[error(transparent)]
    Queue(#[from] cortex_queue::QueueError),
    /// The engine refused work.
    #[error(transparent)]
    Engine(#[from] cortex_engine::EngineError),
    /// The engine died; its in-flight items were ended as in a worker death.
    #[error("the engine died: {message} ({items} in-flight items will be retried)")]
    EngineDied {
        /// The engine's message (its panic).
        message: String,
        /// How many items were in flight.
        items: usize,
    },
    /// The model cannot be used.
    #[error("{detail}")]
    Model {
        /// The model setting (a name or a path).
        model: String,
        /// What is wrong (naming the file or the known model).
        detail: String,
    },
}
