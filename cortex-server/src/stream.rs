//! One online request's life in the engine ([`Call`]: submitted above every
//! queued item's priority, cancelled when dropped unfinished, measured), and
//! its OpenAI server-sent events: chat and completion chunks ending in
//! `data: [DONE]`, or `/v1/responses` events.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cortex_engine::{EngineEvent, EventReceiver};
use cortex_openai::{ChunkHead, Endpoint, OnlineRequest, ResponseEvents, StreamOptions};
use cortex_request::{RequestId, TokenLogprob, Work};
use serde_json::Value;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::pool::ModelUse;
use crate::state::AppState;

/// Added to an online request's priority: the engine admits every online
/// request before any queued item that waits (queue items keep their own
/// priorities, far below). Running items are not preempted for it; the
/// slots the server's worker leaves free (`batch_parallel`) are what keeps
/// time to first token low.
pub const ONLINE_PRIORITY: i32 = 1 << 20;

/// How far a client's `priority` may go either way: the configured bound,
/// held below half of [`ONLINE_PRIORITY`] so that every online request
/// outranks every queued item whatever both ask for.
pub(crate) fn client_priority_bound(config: &crate::ServerConfig) -> i32 {
    config.max_client_priority.clamp(0, ONLINE_PRIORITY / 2 - 1)
}

/// An online request in the engine. Dropped before its last event (the
/// client went away, the handler was cancelled) it cancels the request.
pub(crate) struct Call {
    state: Arc<AppState>,
    /// The model it runs on, held (not unloaded) until the call ends.
    model: ModelUse,
    id: RequestId,
    events: EventReceiver,
    arrived: Instant,
    endpoint: &'static str,
    first_token: bool,
    ended: bool,
    /// The event [`Call::first`] looked at, given again by [`Call::next`].
    peeked: Option<EngineEvent>,
}

impl Call {
    /// Submits `work` to `model` (its id, priority and cache scope set
    /// here, the last from `caller`'s project) for `endpoint` (the route,
    /// for metrics).
    pub(crate) fn submit(
        state: &Arc<AppState>,
        caller: &Caller,
        model: ModelUse,
        mut work: Work,
        endpoint: &'static str,
    ) -> Result<Self, ApiError> {
        if let Work::Generate(request) = &work {
            state.check_request_tokens(request, &model)?;
        }
        let id = state.online_id();
        match &mut work {
            Work::Generate(request) => {
                request.id = id;
                let bound = client_priority_bound(&state.config);
                request.priority = request.priority.clamp(-bound, bound) + ONLINE_PRIORITY;
                request.cache_scope = caller.cache_scope;
                // Another name of the loaded weights renders with its own template.
                request.chat_template = model
                    .asked()
                    .chat_template(state.config.chat_template.as_deref());
            }
            Work::Embed(request) => request.id = id,
            _ => {
                state.online_done(id);
                return Err(ApiError::internal(
                    "a kind of work this server does not know",
                ));
            }
        }
        let (sender, events) = cortex_engine::event_channel();
        if let Err(error) = model.engine.submit_many_to(vec![work], &sender) {
            state.online_done(id);
            return Err(ApiError::engine(&error));
        }
        Ok(Self {
            state: Arc::clone(state),
            model,
            id,
            events,
            arrived: Instant::now(),
            endpoint,
            first_token: false,
            ended: false,
            peeked: None,
        })
    }

    /// The next event; `None` once the last was taken or the engine went away.
    pub(crate) async fn next(&mut self) -> Option<EngineEvent> {
        if let Some(event) = self.peeked.take() {
            return Some(event);
        }
        if self.ended {
            return None;
        }
        let Some(event) = self.events.recv_async().await else {
            self.ended = true;
            return None;
        };
        let metrics = &self.state.metrics;
        match &event {
            EngineEvent::Token { .. } if !self.first_token => {
                self.first_token = true;
                metrics.first_token(self.endpoint, self.arrived.elapsed());
            }
            EngineEvent::Finished(response) => {
                self.ended = true;
                metrics.finished(
                    self.endpoint,
                    u64::from(response.usage.prompt_tokens),
                    u64::from(response.usage.completion_tokens),
                    self.arrived.elapsed(),
                );
            }
            EngineEvent::Failed { .. } => self.ended = true,
            _ => {}
        }
        Some(event)
    }

    /// Waits for the whole response.
    pub(crate) async fn finish(&mut self) -> Result<cortex_request::Response, ApiError> {
        while let Some(event) = self.next().await {
            match event {
                EngineEvent::Finished(response) => return Ok(response),
                EngineEvent::Failed { error, .. } => return Err(ApiError::engine(&error)),
                _ => {}
            }
        }
        Err(ApiError::engine(&cortex_engine::EngineError::Stopped))
    }

    /// Waits for the first event, turning an early failure (the prompt does
    /// not fit, a bad template) into an error response before any byte is
    /// streamed; otherwise [`Call::next`] gives that event first.
    pub(crate) async fn first(&mut self) -> Result<(), ApiError> {
        match self.next().await {
            Some(EngineEvent::Failed { error, .. }) => Err(ApiError::engine(&error)),
            Some(event) => {
                self.peeked = Some(event);
                Ok(())
            }
            None => Err(ApiError::engine(&cortex_engine::EngineError::Stopped)),
        }
    }

    /// Time since the request arrived.
    pub(crate) fn elapsed(&self) -> Duration {
        self.arrived.elapsed()
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.ended {
            self.model.engine.cancel(self.id);
        }
        self.state.online_done(self.id);
    }
}

/// The state of one SSE response.
struct SseState {
    call: Call,
    out: VecDeque<Event>,
    head: ChunkHead,
    endpoint: Endpoint,
    options: StreamOptions,
    sent: HashMap<u32, String>,
    /// Per chat choice, the calls whose first piece was sent.
    calls_sent: HashMap<u32, usize>,
    /// Per choice, the log probabilities of tokens whose text is not sent
    /// yet (held back in a character or a possible stop string); `None`
    /// when the request asked for none.
    logprobs: Option<HashMap<u32, StreamedLogprobs>>,
    responses: Option<ResponseEvents>,
    /// The project a streamed `/v1/responses` answer is kept for, if it is;
    /// then the answer, kept before its last events go out (so a client
    /// that reads it back right after finds it).
    keep: Option<String>,
    to_keep: Option<(Value, String)>,
    done: bool,
}

/// A streamed choice's log probabilities: those waiting for their text,
/// and how many tokens (and characters of their text) went out before.
#[derive(Default)]
struct StreamedLogprobs {
    pending: Vec<TokenLogprob>,
    sent: usize,
    sent_chars: usize,
}

impl StreamedLogprobs {
    /// The pending ones, now sent, and the character offset of the first.
    fn take(&mut self) -> (Vec<TokenLogprob>, usize) {
        let offset = self.sent_chars;
        self.sent += self.pending.len();
        self.sent_chars += self
            .pending
            .iter()
            .map(|l| String::from_utf8_lossy(&l.chosen.bytes).chars().count())
            .sum::<usize>();
        (std::mem::take(&mut self.pending), offset)
    }
}

impl SseState {
    fn push(&mut self, value: &Value) {
        self.out.push_back(Event::default().data(value.to_string()));
    }

    fn push_named(&mut self, events: Vec<(String, Value)>) {
        for (name, data) in events {
            self.out
                .push_back(Event::default().event(name).data(data.to_string()));
        }
    }

    fn text(&mut self, index: u32, text: &str) {
        if text.is_empty() {
            return;
        }
        let logprobs = self
            .logprobs
            .as_mut()
            .map(|all| all.entry(index).or_default().take());
        if let Some(events) = &mut self.responses {
            let event = events.delta(text);
            self.push_named(vec![event]);
            self.sent.entry(index).or_default().push_str(text);
            return;
        }
        self.open_choice(index);
        let (logprobs, offset) = match &logprobs {
            Some((logprobs, offset)) => (Some(logprobs.as_slice()), *offset),
            None => (None, 0),
        };
        let chunk = self.head.text(self.endpoint, index, text, logprobs, offset);
        self.push(&chunk);
        self.sent.entry(index).or_default().push_str(text);
    }

    /// Opens chat choice `index` (its role chunk) before anything of it.
    fn open_choice(&mut self, index: u32) {
        if self.endpoint == Endpoint::ChatCompletions && !self.sent.contains_key(&index) {
            let role = self.head.chat_role(index);
            self.push(&role);
            self.sent.insert(index, String::new());
        }
    }

    fn on_event(&mut self, event: EngineEvent) {
        match event {
            EngineEvent::Token {
                index,
                text,
                reasoning,
                call_pieces,
                logprob,
                ..
            } => {
                if let (Some(all), Some(logprob)) = (&mut self.logprobs, logprob) {
                    all.entry(index).or_default().pending.push(logprob);
                }
                // A chat's thinking and calls go out as they come (the
                // answer's text in `text`, below).
                if self.endpoint == Endpoint::ChatCompletions && self.responses.is_none() {
                    if !reasoning.is_empty() {
                        self.open_choice(index);
                        let chunk = self.head.reasoning(index, &reasoning);
                        self.push(&chunk);
                    }
                    if !call_pieces.is_empty() {
                        self.open_choice(index);
                        let chunk = self.head.call_pieces(index, &call_pieces);
                        self.push(&chunk);
                        let opened = call_pieces.iter().filter(|p| p.name.is_some()).count();
                        *self.calls_sent.entry(index).or_default() += opened;
                    }
                }
                self.text(index, &text);
            }
            EngineEvent::Finished(response) => {
                for completion in &response.completions {
                    // Text released only at the end (a stop string that did not match).
                    let sent = self.sent.get(&completion.index).map_or("", String::as_str);
                    let rest = completion.text.strip_prefix(sent).unwrap_or("").to_owned();
                    self.text(completion.index, &rest);
                    self.open_choice(completion.index);
                }
                if let Some(mut events) = self.responses.take() {
                    let last = events.finish(&response);
                    if let (Some(project), Some((_, event))) = (self.keep.take(), last.last()) {
                        self.to_keep = Some((event["response"].clone(), project));
                    }
                    self.push_named(last);
                } else {
                    for completion in &response.completions {
                        let index = completion.index;
                        let (logprobs_sent, offset) = self
                            .logprobs
                            .as_ref()
                            .and_then(|all| all.get(&index))
                            .map_or((0, 0), |l| (l.sent, l.sent_chars));
                        let calls_sent = self.calls_sent.get(&index).copied().unwrap_or(0);
                        let chunk = self.head.finish(
                            self.endpoint,
                            completion,
                            (logprobs_sent, offset),
                            calls_sent,
                        );
                        self.push(&chunk);
                    }
                    if self.options.include_usage {
                        let chunk = self.head.usage(self.endpoint, &response.usage);
                        self.push(&chunk);
                    }
                    self.out.push_back(Event::default().data("[DONE]"));
                }
                self.done = true;
            }
            EngineEvent::Failed { error, .. } => {
                let body = ApiError::engine(&error).body_json();
                self.push(&body);
                self.done = true;
            }
            _ => {}
        }
    }
}

/// Streams an online request's events as SSE (after [`Call::first`]).
pub(crate) fn sse(
    call: Call,
    request: &OnlineRequest,
    head: ChunkHead,
    options: StreamOptions,
    keep: Option<String>,
) -> Response {
    let responses =
        (request.endpoint == Endpoint::Responses).then(|| ResponseEvents::new(head.clone()));
    let mut state = SseState {
        call,
        out: VecDeque::new(),
        head,
        endpoint: request.endpoint,
        options,
        sent: HashMap::new(),
        calls_sent: HashMap::new(),
        logprobs: matches!(&request.work, Work::Generate(r) if r.logprobs.is_some())
            .then(HashMap::new),
        responses,
        keep,
        to_keep: None,
        done: false,
    };
    if let Some(events) = &mut state.responses {
        let start = events.start();
        state.push_named(start);
    }
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        loop {
            if let Some((response, project)) = state.to_keep.take() {
                state.call.state.keep_response(response, project).await;
            }
            if let Some(event) = state.out.pop_front() {
                return Some((Ok::<Event, Infallible>(event), state));
            }
            if state.done {
                return None;
            }
            match state.call.next().await {
                Some(event) => state.on_event(event),
                None => {
                    let body = ApiError::engine(&cortex_engine::EngineError::Stopped).body_json();
                    state.push(&body);
                    state.done = true;
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
