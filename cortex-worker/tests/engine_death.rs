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

use cortex_engine::fake::FakeExecutor;
use cortex_engine::{Engine, EngineConfig, EngineError};
use cortex_openai::SubmitJsonl;
use cortex_queue::{ItemState, JobState, SubmitOptions};
use cortex_queue_sqlite::Store;
use cortex_worker::{WorkerError, WorkerPlan, run_worker, work_queue};

fn engine(panic_after: Option<usize>) -> Engine {
    let mut config = EngineConfig::for_fake_executor(4, 16);
    config.prefix_sharing = false;
    Engine::start_with_executor(config, move || {
        // Slow enough that several items are in flight at the panic.
        let fake = FakeExecutor::new().decoding_for(Duration::from_millis(5));
        Ok::<_, EngineError>(match panic_after {
            Some(decodes) => fake.panicking_after(decodes),
            None => fake,
        })
    })
    .unwrap()
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
        .submit_file(&input, &SubmitOptions::new("fake"))
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
    assert!(message.contains("injected executor bug"), "{message}");
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
            text.contains("the engine died: ") && text.contains("injected executor bug"),
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
