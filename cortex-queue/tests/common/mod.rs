//! Helpers shared by the queue's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use cortex_openai::SubmitJsonl;
use cortex_queue::{ClaimedItem, JobId, Store, StoreConfig, SubmitOptions};
use cortex_request::{Completion, FinishReason, Response, Timings, Usage};

/// A JSONL file of `n` prompts alternating between the OpenAI chat format and plain completions.
pub fn write_prompts(dir: &Path, name: &str, n: usize) -> PathBuf {
    let mut text = String::new();
    for i in 0..n {
        if i % 2 == 0 {
            text.push_str(&format!(
                r#"{{"custom_id": "item-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {{"messages": [{{"role": "user", "content": "Question {i}?"}}], "max_tokens": 16}}}}"#
            ));
        } else {
            text.push_str(&format!(
                r#"{{"custom_id": "item-{i}", "prompt": "Story {i}:", "max_tokens": 16}}"#
            ));
        }
        text.push('\n');
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// What a worker would produce for `item` (deterministic, so duplicates would show).
pub fn response_for(item: &ClaimedItem) -> Response {
    Response {
        id: item.request.id(),
        completions: vec![Completion {
            index: 0,
            text: format!("answer to {}", item.custom_id),
            tokens: vec![1, 2, 3],
            finish_reason: FinishReason::Length,
            logprobs: None,
            tool_calls: Vec::new(),
        }],
        usage: Usage {
            prompt_tokens: 7,
            completion_tokens: 3,
            cached_prompt_tokens: 0,
        },
        timings: Timings::default(),
        embeddings: Vec::new(),
    }
}

/// A store with fast retries (and lone suspects retried at once), for tests
/// that exercise backoff and worker deaths.
pub fn open_fast(path: &Path) -> Store {
    let config = StoreConfig {
        retry_backoff: std::time::Duration::from_millis(50),
        max_retry_backoff: std::time::Duration::from_millis(200),
        lone_retry: std::time::Duration::ZERO,
        ..StoreConfig::default()
    };
    Store::open_with(path, config).unwrap()
}

/// Submits a job of `n` prompts (see [`write_prompts`]) with default options.
pub fn submit_prompts(store: &mut Store, dir: &Path, name: &str, n: usize) -> JobId {
    store
        .submit_file(&write_prompts(dir, name, n), &SubmitOptions::new("m"))
        .unwrap()
        .job
}
