//! The SQLite queue as a durable job queue of its own, without the engine:
//! a job of five lines; one worker claims two and dies without a word; a
//! second worker, on its own connection, takes everything once the first
//! one's leases expire; the results come out in input order, none lost,
//! none done twice.
//!
//! ```text
//! cargo run -p cortex-queue-sqlite --example job_queue
//! ```

use std::process::ExitCode;
use std::time::Duration;

use cortex_queue::{
    ClaimOptions, ExportFormat, ExportedError, ExportedResult, ItemSource, Job, JobStore,
    LineResult, NewItem, StoredResult, SubmitOptions, WorkerStore,
};
use cortex_queue_sqlite::Store;
use cortex_request::{Completion, FinishReason, Request, RequestId, Response, Timings, Usage};

#[cfg_attr(test, allow(dead_code))]
fn main() -> ExitCode {
    match run() {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("job_queue: {error}");
            ExitCode::FAILURE
        }
    }
}

/// A job's lines, already parsed (reading a file is the wire format's
/// business: `cortex_openai::SubmitJsonl`).
struct Prompts(std::vec::IntoIter<LineResult>);

impl Iterator for Prompts {
    type Item = std::io::Result<LineResult>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(Ok)
    }
}

impl ItemSource for Prompts {
    fn source_sha256(&mut self) -> String {
        "five prompts".into()
    }
}

/// Each result as `custom_id<TAB>text`.
struct Tabbed;

impl ExportFormat for Tabbed {
    fn result_line(&self, _: &Job, result: &ExportedResult) -> String {
        match &result.result {
            StoredResult::Response(response) => {
                format!("{}\t{}", result.custom_id, response.completions[0].text)
            }
            StoredResult::Rendered(body) => body.clone(),
        }
    }
    fn error_line(&self, _: &Job, error: &ExportedError) -> String {
        format!("{}\t{}", error.custom_id, error.message)
    }
}

/// A made-up generation: the line's number, spelled out.
fn answer(id: RequestId, line: u64) -> Response {
    Response {
        id,
        completions: vec![Completion {
            index: 0,
            text: format!("the answer to line {line}"),
            tokens: vec![1, 2, 3],
            finish_reason: FinishReason::Eos,
            logprobs: None,
            prompt_logprobs: None,
            tool_calls: Vec::new(),
            reasoning: None,
        }],
        usage: Usage {
            prompt_tokens: 4,
            completion_tokens: 3,
            cached_prompt_tokens: 0,
        },
        timings: Timings::default(),
        embeddings: Vec::new(),
    }
}

/// Runs the story; what it printed.
fn run() -> Result<String, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("queue.db");
    let lines = (1..=5)
        .map(|line| {
            Ok(NewItem {
                line,
                custom_id: format!("q{line}"),
                endpoint: "/v1/completions".into(),
                model: None,
                request: Request::new(RequestId(0), format!("Question {line}")).into(),
            })
        })
        .collect::<Vec<_>>();
    let mut submitter = Store::open(&db)?;
    let job = submitter
        .submit_items(
            &mut Prompts(lines.into_iter()),
            "five prompts",
            &SubmitOptions::new("any-model"),
        )?
        .job;
    let mut report = format!("submitted job {job} to {}\n", db.display());

    // The first worker claims two items on a short lease, then dies.
    let short = ClaimOptions {
        lease: Duration::from_millis(200),
        ..ClaimOptions::default()
    };
    let claimed = Store::open(&db)?.claim(2, &short)?;
    report += &format!("worker 1 claimed {} items and died\n", claimed.len());
    std::thread::sleep(Duration::from_millis(300));

    // The second finds them again once their leases ran out.
    let mut worker = Store::open(&db)?;
    let mut done = 0;
    loop {
        let claimed = worker.claim(4, &ClaimOptions::default())?;
        if claimed.is_empty() {
            break;
        }
        for item in &claimed {
            worker.complete(&item.lease, &answer(item.request.id(), item.line))?;
            done += 1;
        }
    }
    report += &format!("worker 2 completed {done} items\n");
    let status = submitter.status(job)?;
    report += &format!(
        "job {job} is {}: {} of {} completed\n",
        status.job.state, status.job.counts.completed, status.job.counts.total
    );
    let output = dir.path().join("results.tsv");
    submitter.export_with(job, &output, None, false, &Tabbed)?;
    report += &std::fs::read_to_string(&output)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_line_is_answered_once_in_input_order() {
        let report = super::run().unwrap();
        assert!(report.contains("worker 2 completed 5 items"), "{report}");
        assert!(report.contains("5 of 5 completed"), "{report}");
        assert!(
            report.ends_with("q4\tthe answer to line 4\nq5\tthe answer to line 5\n"),
            "{report}"
        );
    }
}
