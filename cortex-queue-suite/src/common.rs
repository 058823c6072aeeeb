//! What the cases share: input files, a worker's deterministic answer.

use std::path::{Path, PathBuf};

use cortex_openai::SubmitJsonl;
use cortex_queue::{ClaimedItem, JobId, Queue, SubmitOptions};
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
            prompt_logprobs: None,
            tool_calls: Vec::new(),
            reasoning: None,
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

/// Submits a job of `n` prompts (see [`write_prompts`]) with default options.
pub fn submit_prompts(store: &mut dyn Queue, dir: &Path, name: &str, n: usize) -> JobId {
    store
        .submit_file(&write_prompts(dir, name, n), &SubmitOptions::new("m"))
        .unwrap()
        .job
}
