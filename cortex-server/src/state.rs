//! What every handler shares: the loaded models, the queue, the files, the
//! metrics, and the online requests in flight (cancelled when their client
//! goes away, or at shutdown).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cortex_queue::{Queue, QueueError};
use cortex_request::{Request, RequestId};

use crate::error::ApiError;
use crate::files::FileStore;
use crate::metrics::Metrics;
use crate::pool::{KeepAlive, ModelPool, ModelUse};
use crate::system::SystemSampler;
use crate::{ServerConfig, ServerError};

/// Online request ids start here, far above any queue item's id.
const ONLINE_IDS: u64 = 1 << 62;

pub(crate) struct AppState {
    pub(crate) config: ServerConfig,
    pub(crate) models: Arc<ModelPool>,
    store: Mutex<Box<dyn Queue>>,
    pub(crate) files: FileStore,
    pub(crate) metrics: Metrics,
    pub(crate) system: SystemSampler,
    next_id: AtomicU64,
    online: Mutex<HashSet<RequestId>>,
    /// Unix seconds at start (the model's `created`).
    pub(crate) started: i64,
    /// Tells the server's worker thread to stop.
    pub(crate) stop_worker: AtomicBool,
    /// `batch_parallel` now: how many queue items the server's worker keeps
    /// in the engine (the setting, or an eighth of it while online requests
    /// are answered).
    pub(crate) batch_parallel: Arc<AtomicUsize>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AppState {
    pub(crate) fn open(
        config: ServerConfig,
        models: Arc<ModelPool>,
    ) -> Result<Arc<Self>, ServerError> {
        let store = config.queue.open()?;
        let files = FileStore::open(&config.files_dir, config.max_project_file_bytes)?;
        Ok(Arc::new(Self {
            models,
            store: Mutex::new(store),
            files,
            metrics: Metrics::new(),
            system: SystemSampler::new(),
            next_id: AtomicU64::new(ONLINE_IDS),
            online: Mutex::new(HashSet::new()),
            started: cortex_queue::now_ms() / 1000,
            stop_worker: AtomicBool::new(false),
            batch_parallel: Arc::new(AtomicUsize::new(config.batch_parallel)),
            config,
        }))
    }

    /// The model a request names (none: the default one), held for the
    /// request's life: loaded first if need be (off the async threads).
    pub(crate) async fn use_model(
        &self,
        asked: Option<&str>,
        keep_alive: Option<KeepAlive>,
    ) -> Result<ModelUse, ApiError> {
        let models = Arc::clone(&self.models);
        let asked = asked.map(str::to_owned);
        let held = off_async(move || {
            let model = models.identify(asked.as_deref())?;
            models.acquire(&model, keep_alive)
        })
        .await?;
        Ok(held?)
    }

    /// Refuses a generation that asks for more tokens than one request may:
    /// `n` completions of each prompt, `max_tokens` each (cut to the context of `model`,
    /// beyond which none can go).
    pub(crate) fn check_request_tokens(
        &self,
        request: &Request,
        model: &ModelUse,
    ) -> Result<(), ApiError> {
        let context = model.engine.info().max_sequence_tokens as u64;
        let each = u64::from(request.stop.max_tokens).min(context);
        let total = each * u64::from(request.choices());
        let limit = self.config.max_request_tokens;
        if total > limit {
            let (product, lower) = if request.prompt.parts().len() > 1 {
                (
                    "n × prompts × max_tokens",
                    "n, the number of prompts or max_tokens",
                )
            } else {
                ("n × max_tokens", "n or max_tokens")
            };
            return Err(ApiError::invalid(
                format!(
                    "the request asks for up to {} × {each} = {total} tokens ({product}, each at most the context of {context}); this server allows {limit} per request: lower {lower}",
                    request.choices()
                ),
                Some("max_tokens".into()),
            ));
        }
        Ok(())
    }

    /// A fresh id for an online request, registered as in flight.
    pub(crate) fn online_id(&self) -> RequestId {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut online = lock(&self.online);
        online.insert(id);
        self.set_batch_parallel(online.len());
        id
    }

    pub(crate) fn online_done(&self, id: RequestId) {
        let mut online = lock(&self.online);
        online.remove(&id);
        self.set_batch_parallel(online.len());
    }

    /// Every step decodes all running sequences, so an online request's
    /// tokens come as fast as steps do: while any online request is in
    /// flight the queue keeps an eighth of its share (at least one item,
    /// so a batch still progresses), the whole share otherwise. Items
    /// already running finish; fewer new ones are claimed.
    fn set_batch_parallel(&self, online: usize) {
        let full = self.config.batch_parallel;
        let limit = if online == 0 {
            full
        } else {
            (full / 8).max(1).min(full)
        };
        self.batch_parallel.store(limit, Ordering::Relaxed);
    }

    /// Online requests in flight.
    pub(crate) fn online_count(&self) -> usize {
        lock(&self.online).len()
    }

    /// Cancels every online request in flight (shutdown).
    pub(crate) fn cancel_online(&self) -> usize {
        let ids: Vec<RequestId> = lock(&self.online).iter().copied().collect();
        self.models.cancel(&ids);
        ids.len()
    }

    /// Keeps a `/v1/responses` answer of `project` for `GET
    /// /v1/responses/{id}` (a failure to write it is logged: the answer
    /// itself went out).
    pub(crate) async fn keep_response(
        self: &Arc<Self>,
        response: serde_json::Value,
        project: String,
    ) {
        let Some(id) = response["id"].as_str().map(str::to_owned) else {
            return;
        };
        let state = Arc::clone(self);
        match off_async(move || state.files.save_response(&id, &response, &project)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!("cannot keep a response: {error}"),
            Err(error) => tracing::warn!("cannot keep a response: {}", error.message),
        }
    }

    /// Runs `f` on the queue off the async threads.
    pub(crate) async fn with_store<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut dyn Queue) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let state = Arc::clone(self);
        off_async(move || f(lock(&state.store).as_mut())).await?
    }
}

/// Runs `f` (parsing a body, compiling a grammar: bounded, but CPU work) on
/// tokio's blocking threads, so that the two async threads stay free to
/// accept and answer other connections meanwhile.
pub(crate) async fn off_async<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a blocking task failed: {e}")))
}

impl From<QueueError> for ApiError {
    fn from(error: QueueError) -> Self {
        match &error {
            QueueError::NoSuchJob(_) | QueueError::NoSuchItem { .. } => {
                ApiError::not_found(error.to_string())
            }
            QueueError::InvalidInput(_) | QueueError::DuplicateJob { .. } => {
                ApiError::invalid(error.to_string(), None)
            }
            QueueError::WrongState { .. } => ApiError::conflict(error.to_string()),
            _ => ApiError::internal(error.to_string()),
        }
    }
}
