//! Shared helpers for the engine tests: the real default model, engines over
//! it, and collecting a request's events.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use cortex_engine::{Engine, EngineConfig, EngineEvent};
use cortex_models::{BlobStore, DEFAULT_MODEL};
use cortex_request::{Request, Response};

pub fn model_path() -> PathBuf {
    BlobStore::default_location()
        .ensure(&DEFAULT_MODEL)
        .expect("default model")
}

/// An engine for one test at a time: engines use every core, and several at
/// once would only thrash (and make timings meaningless).
pub struct TestEngine {
    engine: Option<Engine>,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for TestEngine {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        self.engine.as_ref().expect("present until drop")
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        // The engine stops before the next test's starts.
        self.engine.take();
    }
}

static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// An engine on the default model, with `edit` applied to the defaults.
pub fn engine(edit: impl FnOnce(&mut EngineConfig)) -> TestEngine {
    let turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = EngineConfig::new(model_path());
    config.parallel = 16;
    config.max_batch_tokens = 512;
    edit(&mut config);
    TestEngine {
        engine: Some(cortex_llama::start(&config).expect("engine starts")),
        _turn: turn,
    }
}

/// Everything a request produced.
#[derive(Debug)]
pub struct Outcome {
    pub events: Vec<EngineEvent>,
}

impl Outcome {
    pub fn response(&self) -> &Response {
        match self.events.last() {
            Some(EngineEvent::Finished(r)) => r,
            other => panic!("request did not finish: {other:?}"),
        }
    }

    /// Concatenated streamed text of completion `index`.
    pub fn streamed_text(&self, index: u32) -> String {
        self.events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Token { index: i, text, .. } if *i == index => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Waits for a request's last event.
pub fn collect(rx: &cortex_engine::EventReceiver) -> Outcome {
    let mut events = Vec::new();
    loop {
        let event = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("event within 5 minutes");
        let last = event.is_terminal();
        events.push(event);
        if last {
            return Outcome { events };
        }
    }
}

/// Submits all requests at once (they reach the engine together) and waits
/// for all of them, in submission order.
pub fn run_all(engine: &Engine, requests: Vec<Request>) -> Vec<Outcome> {
    let receivers = engine.submit_many(requests).expect("accepted");
    receivers.iter().map(collect).collect()
}
