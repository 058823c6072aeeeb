//! The step loop over a fake executor, for what the real model cannot be made
//! to do on demand: fail, die, and show exactly which cells each stream holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{
    BatchToken, ComputedOn, Engine, EngineConfig, EngineError, EngineEvent, EngineHealth, Executor,
    ExecutorError, KvLayout, StepRecord, StreamId,
};
use cortex_chat::{Conversation, OutputSyntax, RenderedChat};
use cortex_request::{
    EmbeddingRequest, FinishReason, Prompt, Request, RequestId, SamplingParams, TokenId, Work,
};

const VOCAB: usize = 32;
const EOS: TokenId = 0;
/// Decoding this token fails.
const POISON: TokenId = 31;
/// A sequence whose prompt starts with this token is steered into POISON.
const STEER: TokenId = 30;
/// Any batch holding this token finds no KV slot.
const STALL: TokenId = 29;

/// The fake model: the token after a sequence is 1 + (the sum of all its
/// tokens) mod 20, so every output depends on every cell before it; a
/// sequence whose first token is STEER continues with POISON. Tokens are
/// 1..=20, so EOS (0) never comes.
fn fake_next(sequence: &[TokenId]) -> TokenId {
    if sequence.first() == Some(&STEER) {
        POISON
    } else {
        1 + (sequence.iter().map(|&t| u64::from(t)).sum::<u64>() % 20) as TokenId
    }
}

/// What the engine should produce for a greedy request under the fake model.
fn expected(prompt: &[TokenId], max_tokens: usize) -> Vec<TokenId> {
    let mut sequence = prompt.to_vec();
    for _ in 0..max_tokens {
        sequence.push(fake_next(&sequence));
    }
    sequence.split_off(prompt.len())
}

/// An executor that keeps the token of every cell of every stream and refuses
/// anything llama.cpp would get wrong silently: writing past a hole, writing
/// a position twice without truncating it, going past a stream's capacity.
/// Its logits come from what the stream holds, so a wrong copy or a missed
/// truncation changes the output.
#[derive(Default)]
struct CheckingExecutor {
    layout: Option<KvLayout>,
    cells: Vec<Vec<TokenId>>,
    /// The next token for each row of the last batch.
    next: Vec<TokenId>,
    /// Panic on this decode call (counting from 1), to kill the loop.
    panic_at: Option<u64>,
    decodes: Arc<AtomicU64>,
    /// Counts the batches whose streams are not one run of consecutive ids.
    gapped_batches: Option<Arc<AtomicU64>>,
    /// Refuses batches of more tokens, as llama.cpp refuses more than its
    /// context's batch; the largest batch seen goes to `largest_batch`.
    batch_limit: Option<usize>,
    largest_batch: Option<Arc<AtomicU64>>,
}

impl CheckingExecutor {
    fn write(&mut self, t: &BatchToken) -> Result<(), ExecutorError> {
        let layout = self.layout.expect("a layout is set first");
        let cells = self
            .cells
            .get_mut(t.stream as usize)
            .ok_or_else(|| ExecutorError::Failed(format!("no stream {}", t.stream)))?;
        if t.pos >= layout.capacity {
            return Err(ExecutorError::Failed(format!(
                "stream {} position {} beyond its {} cells",
                t.stream, t.pos, layout.capacity
            )));
        }
        if t.pos != cells.len() {
            return Err(ExecutorError::Failed(format!(
                "stream {} holds {} cells; position {} written",
                t.stream,
                cells.len(),
                t.pos
            )));
        }
        cells.push(t.token);
        Ok(())
    }
}

impl Executor for CheckingExecutor {
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
        self.layout.expect("a layout is set first")
    }
    fn set_kv_layout(&mut self, layout: KvLayout) -> Result<(), ExecutorError> {
        self.layout = Some(layout);
        self.cells = vec![Vec::new(); layout.streams];
        Ok(())
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
    fn apply_chat_template(
        &self,
        conversation: &Conversation<'_>,
        _template: &cortex_request::ChatTemplateChoice,
    ) -> Result<RenderedChat, ExecutorError> {
        Ok(RenderedChat {
            prompt: conversation
                .messages
                .iter()
                .map(|m| m.content.as_str())
                .collect(),
            syntax: OutputSyntax::plain(),
            grammar: None,
        })
    }
    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), ExecutorError> {
        let call = self.decodes.fetch_add(1, Ordering::SeqCst) + 1;
        if self.panic_at == Some(call) {
            panic!("injected panic in decode call {call}");
        }
        if batch.iter().any(|t| t.token == STALL) {
            return Err(ExecutorError::NoKvSlot);
        }
        if let Some(largest) = &self.largest_batch {
            largest.fetch_max(batch.len() as u64, Ordering::SeqCst);
        }
        if let Some(limit) = self.batch_limit
            && batch.len() > limit
        {
            return Err(ExecutorError::Failed(format!(
                "batch of {} tokens exceeds the context's {limit}",
                batch.len()
            )));
        }
        if let Some(gapped) = &self.gapped_batches {
            let mut streams: Vec<StreamId> = batch.iter().map(|t| t.stream).collect();
            streams.dedup();
            if streams.windows(2).any(|w| w[1] != w[0] + 1) {
                gapped.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.next.clear();
        for t in batch {
            self.write(t)?;
            let cells = &self.cells[t.stream as usize];
            self.next.push(fake_next(cells));
        }
        // Like llama.cpp, a failing batch may have written its cells.
        if batch.iter().any(|t| t.token == POISON) {
            return Err(ExecutorError::Failed("injected failure".into()));
        }
        Ok(())
    }
    fn logits(&self, index: usize) -> &[f32] {
        // A static row per token value keeps the borrow simple.
        &ROWS[self.next[index] as usize]
    }
    /// Each input's vector is (its length, the sum of its tokens); an input
    /// holding POISON fails the batch. Every batch's (inputs, tokens) is kept.
    fn embed(&mut self, inputs: &[Vec<TokenId>]) -> Result<Vec<Vec<f32>>, ExecutorError> {
        let tokens = inputs.iter().map(Vec::len).sum();
        EMBED_BATCHES.lock().unwrap().push((inputs.len(), tokens));
        if inputs.iter().flatten().any(|&t| t == POISON) {
            return Err(ExecutorError::Failed("injected embedding failure".into()));
        }
        Ok(inputs
            .iter()
            .map(|i| vec![i.len() as f32, i.iter().sum::<TokenId>() as f32])
            .collect())
    }
    fn copy_stream(&mut self, src: StreamId, dst: StreamId) {
        self.cells[dst as usize] = self.cells[src as usize].clone();
    }
    fn truncate_stream(&mut self, stream: StreamId, from: usize) {
        self.cells[stream as usize].truncate(from);
    }
}

/// (inputs, tokens) of every embedding batch the fake computed.
static EMBED_BATCHES: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

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
    let mut config = EngineConfig::for_fake_executor(8, 4);
    config.request_timeout = request_timeout;
    start_with(config, CheckingExecutor::default)
}

fn start_with(config: EngineConfig, make: fn() -> CheckingExecutor) -> Engine {
    Engine::start_with_executor(config, move || Ok(make())).unwrap()
}

fn request(id: u64, prompt: Vec<TokenId>) -> Request {
    let mut r = Request::new(RequestId(id), Prompt::Tokens(prompt));
    r.sampling = SamplingParams::greedy();
    r.stop.max_tokens = 6;
    r
}

fn last_event(rx: &crate::EventReceiver) -> EngineEvent {
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
                    error: EngineError::Executor { source, .. },
                    ..
                },
            ) => {
                assert_eq!(source.to_string(), "injected failure");
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
        EngineError::Executor {
            id: RequestId(2),
            source: ExecutorError::Failed(String::new())
        }
        .is_retryable()
    );
}

#[test]
fn outputs_follow_the_fake_model_token_for_token() {
    let engine = start();
    let mut r = request(9, vec![17, 18]);
    r.stop.max_tokens = 10;
    match last_event(&engine.submit(r).unwrap()) {
        EngineEvent::Finished(response) => {
            let tokens = &response.completions[0].tokens;
            assert_eq!(tokens, &expected(&[17, 18], 10));
            let text: String = tokens
                .iter()
                .map(|&t| (b'a' + (t % 26) as u8) as char)
                .collect();
            assert_eq!(response.completions[0].text, text);
        }
        other => panic!("{other:?}"),
    }
}

/// Sixteen prompts sharing a 24-token prefix, each with its own tail.
fn shared_prefix_requests(first_id: u64) -> Vec<(Request, Vec<TokenId>)> {
    let prefix: Vec<TokenId> = (0..24).map(|i| 1 + (i * 7) % 20).collect();
    (0..16)
        .map(|i| {
            let mut prompt = prefix.clone();
            prompt.extend([1 + (i as TokenId) % 20, 2, 3 + (i as TokenId * 3) % 17]);
            let mut r = request(first_id + i, prompt.clone());
            r.stop.max_tokens = 12;
            (r, prompt)
        })
        .collect()
}

fn run_to_end(engine: &Engine, requests: Vec<Request>) -> Vec<Vec<TokenId>> {
    let receivers = engine.submit_many(requests).unwrap();
    receivers
        .iter()
        .map(|rx| match last_event(rx) {
            EngineEvent::Finished(r) => r.completions[0].tokens.clone(),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn shared_prefixes_are_copied_or_taken_over_and_give_the_exact_outputs() {
    for sharing in [true, false] {
        let mut config = EngineConfig::for_fake_executor(8, 4);
        config.prefix_sharing = sharing;
        let engine = start_with(config, CheckingExecutor::default);
        // Twice: the second wave finds the prefix in streams retired by the first.
        for wave in 0..2 {
            let batch = shared_prefix_requests(100 * wave + 1);
            let outputs = run_to_end(&engine, batch.iter().map(|(r, _)| r.clone()).collect());
            for ((_, prompt), output) in batch.iter().zip(&outputs) {
                assert_eq!(output, &expected(prompt, 12), "sharing {sharing}");
            }
        }
        let stats = engine.stats();
        if sharing {
            assert!(stats.prefix_copies > 0, "{stats:?}");
            assert!(stats.prefix_takeovers > 0, "{stats:?}");
            assert!(
                stats.prefill_tokens_saved >= 30 * 24 / 4 * 4 / 2,
                "{stats:?}"
            );
        } else {
            assert_eq!(stats.prefix_copies + stats.prefix_takeovers, 0);
            assert_eq!(stats.prefill_tokens_saved, 0);
        }
    }
}

#[test]
fn n_completions_copy_the_first_ones_prompt() {
    let engine = start();
    let prompt: Vec<TokenId> = (1..=18).collect();
    let mut r = request(50, prompt.clone());
    r.n = 5;
    r.stop.max_tokens = 7;
    match last_event(&engine.submit(r).unwrap()) {
        EngineEvent::Finished(response) => {
            assert_eq!(response.completions.len(), 5);
            for c in &response.completions {
                assert_eq!(c.tokens, expected(&prompt, 7));
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(engine.stats().prefill_tokens_saved >= 4 * 16);
}

#[test]
fn a_prompt_list_gives_n_completions_of_each_prompt_in_order() {
    let engine = start();
    let prompts: Vec<Vec<TokenId>> = vec![(1..=5).collect(), vec![7, 3], (2..=12).collect()];
    let mut r = request(60, Vec::new());
    r.prompt = Prompt::Several(prompts.iter().cloned().map(Prompt::Tokens).collect());
    r.n = 2;
    match last_event(&engine.submit(r).unwrap()) {
        EngineEvent::Finished(response) => {
            assert_eq!(response.completions.len(), 6);
            for (k, c) in response.completions.iter().enumerate() {
                assert_eq!(c.index as usize, k);
                assert_eq!(c.tokens, expected(&prompts[k / 2], 6), "completion {k}");
            }
            assert_eq!(response.usage.prompt_tokens, 5 + 2 + 11);
            assert_eq!(response.usage.completion_tokens, 6 * 6);
        }
        other => panic!("{other:?}"),
    }
    // An entry that cannot be a prompt fails the request, naming it.
    let mut r = request(61, Vec::new());
    r.prompt = Prompt::Several(vec![Prompt::Tokens(vec![1]), Prompt::Tokens(vec![99])]);
    match last_event(&engine.submit(r).unwrap()) {
        EngineEvent::Failed {
            error: EngineError::Invalid { field, .. },
            ..
        } => assert_eq!(field, "prompt[1]"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_longer_request_grows_the_streams_and_running_ones_are_recomputed_exactly() {
    let engine = start();
    let short: Vec<(Request, Vec<TokenId>)> = (0..6)
        .map(|i| {
            let prompt = vec![1 + i, 2, 3];
            let mut r = request(60 + u64::from(i), prompt.clone());
            r.stop.max_tokens = 150;
            (r, prompt)
        })
        .collect();
    let receivers = engine
        .submit_many(short.iter().map(|(r, _)| r.clone()).collect())
        .unwrap();
    // Wait until they run, then send one that needs more than 256 cells.
    assert!(matches!(
        receivers[0].recv().unwrap(),
        EngineEvent::Token { .. }
    ));
    let long_prompt: Vec<TokenId> = (0..300).map(|i| 1 + i % 20).collect();
    let mut long = request(70, long_prompt.clone());
    long.stop.max_tokens = 40;
    let long_rx = engine.submit(long).unwrap();
    for ((_, prompt), rx) in short.iter().zip(&receivers) {
        match last_event(rx) {
            EngineEvent::Finished(r) => assert_eq!(r.completions[0].tokens, expected(prompt, 150)),
            other => panic!("{other:?}"),
        }
    }
    match last_event(&long_rx) {
        EngineEvent::Finished(r) => assert_eq!(r.completions[0].tokens, expected(&long_prompt, 40)),
        other => panic!("{other:?}"),
    }
    let stats = engine.stats();
    assert_eq!(stats.kv_resizes, 1, "{stats:?}");
    assert_eq!(stats.kv_stream_tokens, 512);
    assert!(
        stats.preemptions >= 6,
        "running requests were recomputed: {stats:?}"
    );
}

#[test]
fn longer_streams_mean_fewer_of_them_within_the_step_cells() {
    // 8 sequences at most, 1,024 cells per step: 4 streams of 256, then 2 of 512.
    let mut config = EngineConfig::for_fake_executor(8, 4);
    config.step_cells = 1024;
    let engine = start_with(config, CheckingExecutor::default);
    let requests: Vec<(Request, Vec<TokenId>)> = (0..6)
        .map(|i| {
            let prompt: Vec<TokenId> = (0..300).map(|j| 1 + (i + j) % 20).collect();
            let mut r = request(80 + u64::from(i), prompt.clone());
            r.stop.max_tokens = 20;
            (r, prompt)
        })
        .collect();
    let short = request(90, vec![1, 2, 3]);
    assert!(matches!(
        last_event(&engine.submit(short).unwrap()),
        EngineEvent::Finished(_)
    ));
    assert_eq!(engine.stats().kv_streams, 4);
    let receivers = engine
        .submit_many(requests.iter().map(|(r, _)| r.clone()).collect())
        .unwrap();
    for ((_, prompt), rx) in requests.iter().zip(&receivers) {
        match last_event(rx) {
            EngineEvent::Finished(r) => assert_eq!(r.completions[0].tokens, expected(prompt, 20)),
            other => panic!("{other:?}"),
        }
    }
    let stats = engine.stats();
    assert_eq!(
        (stats.kv_streams, stats.kv_stream_tokens),
        (2, 512),
        "{stats:?}"
    );
}

#[test]
fn a_fixed_stream_size_refuses_longer_prompts_and_cuts_generation_at_its_end() {
    let mut config = EngineConfig::for_fake_executor(4, 4);
    config.stream_tokens = Some(256);
    let engine = start_with(config, CheckingExecutor::default);
    let too_long = request(80, vec![1; 300]);
    match last_event(&engine.submit(too_long).unwrap()) {
        EngineEvent::Failed {
            error:
                EngineError::PromptTooLong {
                    prompt_tokens,
                    limit,
                    ..
                },
            ..
        } => assert_eq!((prompt_tokens, limit), (300, 256)),
        other => panic!("{other:?}"),
    }
    let mut near = request(81, vec![1; 250]);
    near.stop.max_tokens = 100;
    match last_event(&engine.submit(near).unwrap()) {
        EngineEvent::Finished(r) => {
            assert_eq!(r.completions[0].tokens.len(), 6);
            assert_eq!(r.completions[0].finish_reason, FinishReason::Length);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.stats().kv_resizes, 0);
}

#[test]
fn a_panic_in_the_loop_fails_every_request_in_hand_and_the_engine_reports_it() {
    let engine = start_with(EngineConfig::for_fake_executor(8, 4), || CheckingExecutor {
        panic_at: Some(5),
        ..CheckingExecutor::default()
    });
    let receivers = engine
        .submit_many((0..6).map(|i| request(90 + i, vec![1, 2, 3])).collect())
        .unwrap();
    for rx in &receivers {
        match last_event(rx) {
            EngineEvent::Failed {
                error: EngineError::Died(message),
                ..
            } => assert_eq!(message, "injected panic in decode call 5"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        engine.health(),
        EngineHealth::Died("injected panic in decode call 5".into())
    );
    assert_eq!(engine.in_flight(), 0);
    assert!(matches!(
        engine.submit(request(99, vec![1])),
        Err(EngineError::Died(_))
    ));
    assert_eq!(
        engine.shutdown(crate::Shutdown::Abort),
        Err(EngineError::Died("injected panic in decode call 5".into()))
    );
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
    engine.shutdown(crate::Shutdown::Drain).unwrap();
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
    long.stop.max_tokens = 4_000;
    long.stop.ignore_eos = true;
    let rx = engine.submit(long).unwrap();
    // Wait until it is generating, then abort.
    assert!(matches!(rx.recv().unwrap(), EngineEvent::Token { .. }));
    engine.shutdown(crate::Shutdown::Abort).unwrap();
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

/// A small deterministic generator for the random workload.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[test]
fn random_workloads_keep_the_kv_binding_consistent_and_every_output_exact() {
    // Few streams, long prompts from a handful of families: streams retire,
    // are taken over, copied from and reclaimed, and the accounting evicts
    // cached blocks. The binding's invariants are checked after every step
    // (debug builds), and every output must follow the fake model exactly.
    let engine = start_with(
        EngineConfig::for_fake_executor(4, 4),
        CheckingExecutor::default,
    );
    random_workload(&engine, 7);
    let stats = engine.stats();
    assert!(
        stats.prefix_copies > 0 && stats.prefix_takeovers > 0,
        "{stats:?}"
    );
    assert!(stats.kv_evicted_blocks > 0, "{stats:?}");
    assert_eq!(stats.requests_failed, 0);
}

#[test]
fn idle_streams_between_running_ones_are_filled_and_emptied_again() {
    // With gap filling every batch's streams are one run of consecutive ids
    // (one llama.cpp micro-batch), and the throwaway tokens leave no trace:
    // the fake's logits come from what each stream holds, so a filler left
    // behind would change a later output.
    let run = |gap_fill: usize| {
        let gapped = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&gapped);
        let mut config = EngineConfig::for_fake_executor(8, 4);
        config.gap_fill = Some(gap_fill);
        let engine = Engine::start_with_executor(config, move || {
            Ok(CheckingExecutor {
                gapped_batches: Some(Arc::clone(&counter)),
                ..CheckingExecutor::default()
            })
        })
        .unwrap();
        random_workload(&engine, 11);
        assert_eq!(engine.stats().requests_failed, 0);
        gapped.load(Ordering::SeqCst)
    };
    assert!(run(0) > 0, "the workload leaves gaps between streams");
    assert_eq!(run(usize::MAX), 0);
}

#[test]
fn fillers_beside_a_full_plan_stay_within_what_a_decode_may_hold() {
    // Prompts long enough to fill every step's token budget while other
    // streams decode and gaps open between them: the fillers go on top of
    // the plan, and an executor sized by `decode_tokens` takes every batch (a
    // refused one would fail the step over to a decode per stream, which
    // made such steps many times slower on a GPU).
    let mut config = EngineConfig::for_fake_executor(8, 4);
    config.gap_fill = Some(usize::MAX);
    let limit = config.decode_tokens();
    let largest = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&largest);
    let decodes = Arc::new(AtomicU64::new(0));
    let calls = Arc::clone(&decodes);
    let engine = Engine::start_with_executor(config.clone(), move || {
        Ok(CheckingExecutor {
            batch_limit: Some(limit),
            largest_batch: Some(Arc::clone(&seen)),
            decodes: Arc::clone(&calls),
            ..CheckingExecutor::default()
        })
    })
    .unwrap();
    random_workload(&engine, 17);
    let stats = engine.stats();
    assert_eq!(stats.requests_failed, 0);
    let largest = largest.load(Ordering::SeqCst) as usize;
    assert!(
        largest > config.planned_tokens(),
        "fillers went beyond a full plan ({largest} tokens at most)"
    );
    assert!(largest <= limit, "{largest} > {limit}");
    // One decode per step: none fell back to a decode per stream.
    assert_eq!(decodes.load(Ordering::SeqCst), stats.steps, "{stats:?}");
}

#[test]
fn even_chunks_cut_steps_and_leave_outputs_exact() {
    // A step's prompt chunks are cut to one length where that takes fewer
    // micro-batches per token, the rest of each running in later steps;
    // every output must still follow the fake model exactly.
    let run = |even: bool| {
        let mut config = EngineConfig::for_fake_executor(8, 4);
        config.gap_fill = Some(usize::MAX);
        config.even_chunks = Some(even);
        let records = recorded_workload(config, 19);
        records.iter().map(|r| r.chunks_evened).sum::<usize>()
    };
    assert!(run(true) > 0, "no step was evened out");
    assert_eq!(run(false), 0);
}

#[test]
fn steady_steps_span_every_stream_and_leave_outputs_exact() {
    // With steady steps every step that decodes writes to all 8 streams
    // (idle ones with a throwaway token whose logits are computed), so its
    // decode micro-batch keeps one shape; joins wait for every 4th step.
    // The fake's logits come from what each stream holds, so a filler left
    // behind would change a later output. Off, the workload does decode
    // with idle streams beside the running ones.
    let run = |steady_steps: usize| {
        let mut config = EngineConfig::for_fake_executor(8, 4);
        config.steady_steps = steady_steps;
        let records = recorded_workload(config, 13);
        let decoding: Vec<&StepRecord> =
            records.iter().filter(|r| r.decode_sequences > 0).collect();
        assert!(decoding.len() > 20, "{} decoding steps", decoding.len());
        decoding.iter().all(|r| r.streams == 8)
    };
    assert!(run(4));
    assert!(
        !run(0),
        "the workload leaves streams idle while others decode"
    );
}

/// Keeps every step record.
struct Recorder(Arc<std::sync::Mutex<Vec<StepRecord>>>);

/// [`random_workload`] with `seed` on an engine of `config` (sized as the
/// CPU is) over the fake executor, none failing; every step's record.
fn recorded_workload(config: EngineConfig, seed: u64) -> Vec<StepRecord> {
    let records = Arc::new(std::sync::Mutex::new(Vec::<StepRecord>::new()));
    let engine = Engine::launch(
        Some(Box::new(Recorder(Arc::clone(&records)))),
        move |launch| {
            launch.run(
                &config.for_device(ComputedOn::Cpu),
                vec![Box::new(CheckingExecutor::default())],
            );
            Ok(())
        },
    )
    .unwrap();
    random_workload(&engine, seed);
    assert_eq!(engine.stats().requests_failed, 0);
    drop(engine);
    let records = records.lock().unwrap();
    records.clone()
}

impl crate::StepObserver for Recorder {
    fn step(&mut self, record: &StepRecord) {
        self.0.lock().unwrap().push(*record);
    }
}

/// Rounds of random requests (shared prompt families, `n` > 1, cancels)
/// through `engine`, each output checked against the fake model.
fn random_workload(engine: &Engine, seed: u64) {
    let mut rng = Lcg(seed);
    let families: Vec<Vec<TokenId>> = (0..5u32)
        .map(|f| (0..40 + 20 * f).map(|i| 1 + (i * (f + 3)) % 20).collect())
        .collect();
    let mut id = 1000;
    for _round in 0..12 {
        let mut batch = Vec::new();
        for _ in 0..1 + rng.below(9) {
            let family = &families[rng.below(families.len() as u64) as usize];
            let keep = family.len() - rng.below(24) as usize;
            let mut prompt = family[..keep].to_vec();
            prompt.extend((0..rng.below(6)).map(|_| 1 + rng.below(20) as TokenId));
            let mut r = request(id, prompt.clone());
            id += 1;
            r.stop.max_tokens = 1 + rng.below(30) as u32;
            r.n = 1 + rng.below(3) as u32;
            batch.push((r, prompt));
        }
        let receivers = engine
            .submit_many(batch.iter().map(|(r, _)| r.clone()).collect())
            .unwrap();
        // Cancel one now and then, mid-flight.
        if rng.below(3) == 0 {
            engine.cancel(batch[0].0.id);
        }
        for ((r, prompt), rx) in batch.iter().zip(&receivers) {
            match last_event(rx) {
                EngineEvent::Finished(response) => {
                    let want = expected(prompt, r.stop.max_tokens as usize);
                    assert_eq!(response.completions.len(), r.n as usize);
                    for c in &response.completions {
                        if c.finish_reason == FinishReason::Cancelled {
                            assert!(want.starts_with(&c.tokens), "{:?}", r.id);
                        } else {
                            assert_eq!(c.tokens, want, "{:?}", r.id);
                        }
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn embedding_inputs_of_many_requests_share_decodes_within_the_limits() {
    let engine = start();
    // 150 one-input requests, one of 100 inputs, one with an input longer
    // than a batch's token budget, interleaved with generation; all in one
    // submission, as a worker hands over what it claimed (requests sent one
    // by one pack as well, but how well depends on when the loop wakes).
    let mut work: Vec<Work> = (0..150u64)
        .map(|id| {
            let input = vec![1 + (id % 7) as TokenId; 1 + (id % 5) as usize];
            Work::Embed(EmbeddingRequest::new(
                RequestId(1000 + id),
                vec![Prompt::Tokens(input)],
            ))
        })
        .collect();
    let many: Vec<Prompt> = (0..100)
        .map(|i| Prompt::Tokens(vec![2; 1 + i % 3]))
        .collect();
    work.push(Work::Embed(EmbeddingRequest::new(RequestId(2000), many)));
    work.push(Work::Embed(EmbeddingRequest::new(
        RequestId(2001),
        vec![Prompt::Tokens(vec![3; 3000])],
    )));
    work.push(Work::Generate(request(1, vec![1, 2, 3])));
    let (events, rx) = crate::event_channel();
    engine.submit_many_to(work, &events).unwrap();
    let mut ended = std::collections::HashMap::new();
    while ended.len() < 153 {
        let event = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("an event");
        if event.is_terminal() {
            ended.insert(event.id().0, event);
        }
    }
    for id in 0..150u64 {
        let Some(EngineEvent::Finished(response)) = ended.get(&(1000 + id)) else {
            panic!("request {id} did not finish")
        };
        let len = 1 + id % 5;
        let token = 1 + id % 7;
        assert_eq!(
            response.embeddings,
            vec![vec![len as f32, (len * token) as f32]]
        );
        assert_eq!(u64::from(response.usage.prompt_tokens), len);
        assert!(response.completions.is_empty());
    }
    let Some(EngineEvent::Finished(many)) = ended.get(&2000) else {
        panic!()
    };
    assert_eq!(many.embeddings.len(), 100);
    assert_eq!(many.embeddings[4], vec![2.0, 4.0]);
    let Some(EngineEvent::Finished(long)) = ended.get(&2001) else {
        panic!()
    };
    assert_eq!(long.embeddings, vec![vec![3000.0, 9000.0]]);
    assert!(matches!(ended.get(&1), Some(EngineEvent::Finished(_))));

    let batches = EMBED_BATCHES.lock().unwrap().clone();
    assert_eq!(batches.iter().map(|b| b.0).sum::<usize>(), 251);
    assert!(
        batches
            .iter()
            .all(|&(inputs, tokens)| inputs <= crate::EMBED_SEQUENCES
                && (tokens <= 512 || inputs == 1)),
        "{batches:?}"
    );
    // Packed: far fewer decodes than inputs.
    assert!(
        batches.len() <= 8,
        "{} decodes for 251 inputs: {batches:?}",
        batches.len()
    );

    // A failing batch fails the requests that had inputs in it, no others;
    // invalid inputs fail at once with the input named.
    let poisoned = engine
        .embed(EmbeddingRequest::new(
            RequestId(3000),
            vec![Prompt::Tokens(vec![POISON])],
        ))
        .unwrap();
    let EngineEvent::Failed { error, .. } = last_event(&poisoned) else {
        panic!()
    };
    assert!(error.is_retryable(), "{error}");
    let outside = engine
        .embed(EmbeddingRequest::new(
            RequestId(3001),
            vec![Prompt::Tokens(vec![1]), Prompt::Tokens(vec![99])],
        ))
        .unwrap();
    let EngineEvent::Failed { error, .. } = last_event(&outside) else {
        panic!()
    };
    assert_eq!(
        error.to_string(),
        "request req-3001: invalid input: input[1]: token id 99 is outside the vocabulary of 32"
    );
    let after = engine
        .embed(EmbeddingRequest::new(RequestId(3002), vec!["ok".into()]))
        .unwrap();
    assert!(matches!(last_event(&after), EngineEvent::Finished(_)));
}
