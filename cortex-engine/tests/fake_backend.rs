//! The step loop over a fake backend, for what the real model cannot be made
//! to do on demand: fail.

use std::collections::HashMap;

use cortex_engine::{
    Backend, BackendError, BatchToken, Engine, EngineError, EngineEvent, LoopConfig, SeqSlot,
};
use cortex_request::{
    ChatMessage, FinishReason, Prompt, Request, RequestId, SamplingParams, TokenId,
};

const VOCAB: usize = 32;
const EOS: TokenId = 0;
/// Decoding this token fails.
const POISON: TokenId = 31;
/// A sequence whose prompt starts with this token is steered into POISON.
const STEER: TokenId = 30;
/// Any batch holding this token finds no KV slot.
const STALL: TokenId = 29;

/// Each sequence counts upwards: after token t comes t + 1 (wrapping below
/// STEER), unless its prompt began with STEER, in which case POISON follows.
#[derive(Default)]
struct FakeBackend {
    first_token: HashMap<SeqSlot, TokenId>,
    last_batch: Vec<BatchToken>,
}

impl Backend for FakeBackend {
    fn n_vocab(&self) -> usize {
        VOCAB
    }
    fn n_ctx_train(&self) -> usize {
        4096
    }
    fn kv_capacity(&self) -> usize {
        4096
    }
    fn max_sequences(&self) -> usize {
        32
    }
    fn tokenize(&self, text: &str, _add_bos: bool, _parse_special: bool) -> Vec<TokenId> {
        text.bytes().map(|b| 1 + TokenId::from(b) % 20).collect()
    }
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        vec![b'a' + (token % 26) as u8]
    }
    fn is_end_of_generation(&self, token: TokenId) -> bool {
        token == EOS
    }
    fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, BackendError> {
        Ok(messages.iter().map(|m| m.content.as_str()).collect())
    }
    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), BackendError> {
        if batch.iter().any(|t| t.token == POISON) {
            return Err(BackendError::Failed("injected failure".into()));
        }
        if batch.iter().any(|t| t.token == STALL) {
            return Err(BackendError::NoKvSlot);
        }
        for t in batch.iter().filter(|t| t.pos == 0) {
            self.first_token.insert(t.seq, t.token);
        }
        self.last_batch = batch.to_vec();
        Ok(())
    }
    fn logits(&self, index: usize) -> &[f32] {
        let t = self.last_batch[index];
        let next = if self.first_token.get(&t.seq) == Some(&STEER) {
            POISON
        } else {
            1 + t.token % 20
        };
        // A static row per token value keeps the borrow simple.
        &ROWS[next as usize]
    }
    fn copy_sequence(&mut self, _src: SeqSlot, _dst: SeqSlot, _from: usize, _to: usize) {}
    fn remove_sequence(&mut self, _seq: SeqSlot, _from: usize, _to: Option<usize>) {}
}

/// Row `i` puts all the mass on token `i`.
static ROWS: std::sync::LazyLock<Vec<Vec<f32>>> = std::sync::LazyLock::new(|| {
    (0..VOCAB)
        .map(|i| {
            (0..VOCAB)
                .map(|j| if i == j { 10.0 } else { 0.0 })
                .collect()
        })
        .collect()
});

fn start() -> Engine {
    start_with_timeout(None)
}

fn start_with_timeout(request_timeout: Option<std::time::Duration>) -> Engine {
    let config = LoopConfig {
        block_size: 4,
        max_running: 8,
        max_batch_tokens: 64,
        prefix_sharing: true,
        request_timeout,
    };
    Engine::start_with_backend(config, || Ok(FakeBackend::default())).unwrap()
}

fn request(id: u64, prompt: Vec<TokenId>) -> Request {
    let mut r = Request::new(RequestId(id), Prompt::Tokens(prompt));
    r.sampling = SamplingParams::greedy();
    r.stop.max_tokens = 6;
    r
}

fn last_event(rx: &flume::Receiver<EngineEvent>) -> EngineEvent {
    loop {
        let event = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("an event");
        if event.is_terminal() {
            return event;
        }
    }
}

#[test]
fn an_injected_decode_failure_fails_only_the_affected_requests() {
    let engine = start();
    let receivers = engine
        .submit_many(vec![
            request(1, vec![1, 2, 3]),
            request(2, vec![4, POISON, 5]), // fails in prefill
            request(3, vec![STEER, 6, 7]),  // fails when its first generated token is decoded
            request(4, vec![8, 9, 10, 11, 12]),
        ])
        .unwrap();
    let ends: Vec<EngineEvent> = receivers.iter().map(last_event).collect();
    for (i, end) in ends.iter().enumerate() {
        match (i, end) {
            (
                1 | 2,
                EngineEvent::Failed {
                    error: EngineError::Backend { detail, .. },
                    ..
                },
            ) => {
                assert_eq!(detail, "injected failure");
            }
            (0 | 3, EngineEvent::Finished(response)) => {
                let c = &response.completions[0];
                assert_eq!(c.finish_reason, FinishReason::Length);
                assert_eq!(c.tokens.len(), 6);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    let stats = engine.stats();
    assert_eq!(stats.requests_failed, 2);
    assert_eq!(stats.requests_finished, 4);
    assert!(
        EngineError::Backend {
            id: RequestId(2),
            detail: String::new()
        }
        .is_retryable()
    );
}

#[test]
fn the_fake_counts_upwards_and_stops_at_eos() {
    let engine = start();
    let mut r = request(9, vec![17, 18]);
    r.stop.max_tokens = 10;
    match last_event(&engine.submit(r).unwrap()) {
        EngineEvent::Finished(response) => {
            // 18 -> 19 -> 20 -> 1 -> 2 ...: counting wraps below 21 and never hits EOS (0).
            assert_eq!(
                response.completions[0].tokens,
                [19, 20, 1, 2, 3, 4, 5, 6, 7, 8]
            );
            assert_eq!(response.completions[0].text, "tubcdefghi");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_requests_fail_at_once_with_the_field_named() {
    let engine = start();
    let mut bad = request(5, vec![1]);
    bad.sampling.top_p = 2.0;
    match last_event(&engine.submit(bad).unwrap()) {
        EngineEvent::Failed {
            error: EngineError::Invalid { field, .. },
            ..
        } => assert_eq!(field, "top_p"),
        other => panic!("{other:?}"),
    }
    match last_event(&engine.submit(request(6, vec![99])).unwrap()) {
        EngineEvent::Failed { error, .. } => {
            assert_eq!(
                error.to_string(),
                "request req-6: invalid prompt: token id 99 is outside the vocabulary of 32"
            );
        }
        other => panic!("{other:?}"),
    }
    // Arriving together, the second is refused while the first is in hand.
    let both = engine
        .submit_many(vec![request(7, vec![1, 2]), request(7, vec![1, 2])])
        .unwrap();
    assert!(matches!(
        last_event(&both[1]),
        EngineEvent::Failed {
            error: EngineError::DuplicateId(_),
            ..
        }
    ));
    assert!(matches!(last_event(&both[0]), EngineEvent::Finished(_)));
}

#[test]
fn draining_finishes_what_is_in_hand_and_aborting_cancels_it() {
    let engine = start();
    let receivers = engine
        .submit_many((0..3).map(|i| request(20 + i, vec![1, 2])).collect())
        .unwrap();
    engine.shutdown(cortex_engine::Shutdown::Drain);
    for rx in &receivers {
        match last_event(rx) {
            EngineEvent::Finished(r) => {
                assert_eq!(r.completions[0].finish_reason, FinishReason::Length);
            }
            other => panic!("{other:?}"),
        }
    }

    let engine = start();
    let mut long = request(30, vec![1, 2]);
    long.stop.max_tokens = 100_000;
    long.stop.ignore_eos = true;
    let rx = engine.submit(long).unwrap();
    // Wait until it is generating, then abort.
    assert!(matches!(rx.recv().unwrap(), EngineEvent::Token { .. }));
    engine.shutdown(cortex_engine::Shutdown::Abort);
    match last_event(&rx) {
        EngineEvent::Finished(r) => {
            assert_eq!(r.completions[0].finish_reason, FinishReason::Cancelled);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_request_that_never_makes_progress_times_out_and_the_others_finish() {
    let engine = start_with_timeout(Some(std::time::Duration::from_millis(300)));
    let mut stuck = request(41, vec![STALL, 1]);
    stuck.priority = -1; // the one preempted each time its batch finds no KV slot
    let mut a = request(42, vec![1, 2, 3]);
    let mut b = request(43, vec![4, 5, 6]);
    // Slow enough that the stuck one is re-admitted many times before they end.
    a.stop.max_tokens = 400;
    b.stop.max_tokens = 400;
    let receivers = engine.submit_many(vec![stuck, a, b]).unwrap();
    match last_event(&receivers[0]) {
        EngineEvent::Failed {
            error: EngineError::Timeout { id, .. },
            ..
        } => assert_eq!(id, RequestId(41)),
        other => panic!("{other:?}"),
    }
    for rx in &receivers[1..] {
        match last_event(rx) {
            EngineEvent::Finished(r) => assert_eq!(r.completions[0].tokens.len(), 400),
            other => panic!("{other:?}"),
        }
    }
    assert!(engine.stats().preemptions > 0);
}
