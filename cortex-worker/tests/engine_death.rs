//! A worker whose engine dies mid-job: its in-flight items are ended as in a
//! worker death (suspects, attempts given back), the engine's panic message is
//! their last error, the run returns `EngineDied`, and a healthy worker then
//! finishes the job with every item attempted once. And a worker whose
//! `parallel` goes down (a server's online traffic) gives its newest
//! items back at once, pending again with their attempts, and finishes the
//! job.

use cortex_queue::JobStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use cortex_engine::{
    Backend, BackendError, BatchToken, Engine, EngineConfig, EngineError, KvLayout, StreamId,
};
use cortex_openai::SubmitJsonl;
use cortex_queue::{ItemState, JobState, SubmitOptions};
use cortex_queue_sqlite::Store;
use cortex_request::{ChatMessage, TokenId};
use cortex_worker::{WorkerError, WorkerPlan, run_worker, work_queue};

const VOCAB: usize = 32;

/// A tiny deterministic model: the next token is always 5; text is bytes.
/// After `panic_after` decodes it panics, as a bug in a backend would.
struct Toy {
    layout: KvLayout,
    logits: Vec<Vec<f32>>,
    decodes: usize,
    panic_after: Option<usize>,
}

impl Toy {
    fn new(panic_after: Option<usize>) -> Self {
        Self {
            layout: KvLayout {
                streams: 1,
                capacity: 256,
            },
            logits: Vec::new(),
            decodes: 0,
            panic_after,
        }
    }
}

impl Backend for Toy {
    fn n_vocab(&self) -> usize {
        VOCAB
    }
    fn n_ctx_train(&self) -> usize {
        4096
    }
    fn kv_bytes_per_token(&self) -> usize {
        64
    }
    fn kv_layout(&self) -> KvLayout {
        self.layout
    }
    fn set_kv_layout(&mut self, layout: KvLayout) -> Result<(), BackendError> {
        self.layout = layout;
        Ok(())
    }
    fn tokenize(&self, text: &str, _add_bos: bool, _parse_special: bool) -> Vec<TokenId> {
        text.bytes().map(|b| TokenId::from(b % 30 + 1)).collect()
    }
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        vec![b'a' + (token as u8 % 26)]
    }
    fn is_end_of_generation(&self, _token: TokenId) -> bool {
        false
    }
    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        _tools: Option<&str>,
    ) -> Result<String, BackendError> {
        Ok(messages.iter().map(|m| m.content.as_str()).collect())
    }
    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), BackendError> {
        self.decodes += 1;
        if self.panic_after.is_some_and(|n| self.decodes > n) {
            panic!("injected backend bug at decode {}", self.decodes);
        }
        // Slow enough that several items are in flight at the panic.
        std::thread::sleep(Duration::from_millis(5));
        self.logits = batch
            .iter()
            .map(|_| {
                let mut row = vec![0.0; VOCAB];
                row[5] = 10.0;
                row
            })
            .collect();
        Ok(())
    }
    fn logits(&self, index: usize) -> &[f32] {
        &self.logits[index]
    }
    fn copy_stream(&mut self, _src: StreamId, _dst: StreamId) {}
    fn truncate_stream(&mut self, _stream: StreamId, _from: usize) {}
}

fn engine(panic_after: Option<usize>) -> Engine {
    let mut config = EngineConfig::for_fake_backend(4, 16);
    config.prefix_sharing = false;
    Engine::start_with_backend(config, move || Ok::<_, EngineError>(Toy::new(panic_after))).unwrap()
}

/// A store in `dir` with one job of 12 prompts of `max_tokens` each.
fn twelve_items(dir: &std::path::Path, max_tokens: u32) -> (Store, cortex_queue::JobId) {
    let input = dir.join("p.jsonl");
    let lines: String = (0..12)
        .map(|i| format!("{{\"prompt\": \"item {i}\", \"max_tokens\": {max_tokens}}}\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let mut store = Store::open(dir.join("q.db")).unwrap();
    let job = store
        .submit_file(&input, &SubmitOptions::new("toy"))
        .unwrap()
        .job;
    (store, job)
}

#[test]
fn an_engine_death_ends_its_items_as_suspects_with_the_panic_as_their_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, job) = twelve_items(dir.path(), 8);
    let plan = WorkerPlan::new(Duration::from_secs(60));
    let stop = AtomicBool::new(false);

    let error = run_worker(&mut store, engine(Some(12)), &plan, &stop, |_| Ok(())).unwrap_err();
    let WorkerError::EngineDied { message, items } = &error else {
        panic!("expected EngineDied, got {error}");
    };
    assert!(message.contains("injected backend bug"), "{message}");
    assert!(*items > 0, "{error}");
    let job_now = store.job(job).unwrap();
    assert_eq!(job_now.counts.running, 0, "nothing is left under a lease");
    let abandoned: Vec<_> = store
        .items(job)
        .unwrap()
        .into_iter()
        .filter(|i| i.error_code.as_deref() == Some("worker_lost"))
        .collect();
    assert_eq!(abandoned.len(), *items);
    for item in &abandoned {
        assert_eq!((item.state, item.attempts), (ItemState::Pending, 0));
        let text = item.error_message.as_deref().unwrap();
        assert!(
            text.contains("the engine died: ") && text.contains("injected backend bug"),
            "{text}"
        );
    }

    // A healthy engine finishes the job; nobody lost an attempt.
    let report = run_worker(&mut store, engine(None), &plan, &stop, |_| Ok(())).unwrap();
    assert!(report.completed > 0);
    let job_now = store.job(job).unwrap();
    assert_eq!(
        (job_now.state, job_now.counts.completed),
        (JobState::Completed, 12)
    );
    assert!(store.items(job).unwrap().iter().all(|i| i.attempts == 1));
}

#[test]
fn a_lower_in_flight_limit_gives_the_newest_items_back_and_the_job_still_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, job) = twelve_items(dir.path(), 60);
    let limit = Arc::new(AtomicUsize::new(4));
    let mut plan = WorkerPlan::new(Duration::from_secs(60));
    plan.parallel = Some(Arc::clone(&limit));
    let engine = engine(None);
    let stop = AtomicBool::new(false);
    let lowered = Arc::clone(&limit);
    let lower = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        lowered.store(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(400));
        lowered.store(4, Ordering::Relaxed);
    });
    let report = work_queue(&mut store, &engine, &plan, &stop, |_| Ok(())).unwrap();
    lower.join().unwrap();
    assert!(report.released >= 3, "{report:?}");
    assert_eq!(report.completed, 12, "{report:?}");
    assert_eq!(store.job(job).unwrap().state, JobState::Completed);
    assert!(
        store.items(job).unwrap().iter().all(|i| i.attempts == 1),
        "released items keep their attempts"
    );
}
