//! The life of jobs and items in one process: claims, leases, failures,
//! cancel/resume/retry, status and export. The conformance suite of the
//! storage boundary: every test runs on SQLite and on PostgreSQL.

use std::thread::sleep;
use std::time::Duration;

use crate::{DriverUnderTest, response_for, submit_prompts, write_prompts};
use cortex_openai::{ExportJsonl, SubmitJsonl};
use cortex_queue::{
    BATCH_EXPIRED, ClaimOptions, CompletionWindow, EXPORT_EVENT, FailOutcome, ItemFailure,
    ItemQuery, ItemState, JobFilter, JobState, LeaseStatus, Queue, QueueError, RetryPolicy,
    SubmitOptions,
};

fn lease(ms: u64) -> ClaimOptions {
    ClaimOptions {
        lease: Duration::from_millis(ms),
        ..ClaimOptions::default()
    }
}

fn failure(retryable: bool) -> ItemFailure {
    ItemFailure {
        code: "driver".into(),
        message: "decode failed".into(),
        retryable,
    }
}

pub fn a_job_runs_to_completion_and_exports_openai_batch_output_in_input_order(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open();
    let job = store
        .submit_file(
            &write_prompts(dir, "p.jsonl", 5),
            &SubmitOptions::new("smol"),
        )
        .unwrap()
        .job;

    let first = store.claim(3, &ClaimOptions::default()).unwrap();
    assert_eq!(
        first
            .iter()
            .map(|c| c.custom_id.as_str())
            .collect::<Vec<_>>(),
        ["item-0", "item-1", "item-2"]
    );
    assert!(first.iter().all(|c| c.attempt == 1
        && c.lease.token == 1
        && c.request.id().0 == c.lease.item.0 as u64));
    let rest = store.claim(10, &ClaimOptions::default()).unwrap();
    assert_eq!(rest.len(), 2);
    assert_eq!(
        store.job(job).unwrap().state,
        JobState::InProgress,
        "nothing pending, items running: in progress until they end"
    );

    // Complete out of order; the export is still in input order.
    for claimed in rest.iter().chain(first.iter().rev()) {
        store
            .complete(&claimed.lease, &response_for(claimed))
            .unwrap();
    }
    let status = store.status(job).unwrap();
    assert_eq!(status.job.state, JobState::Completed);
    assert_eq!(
        (
            status.job.counts.completed,
            status.job.prompt_tokens,
            status.job.completion_tokens
        ),
        (5, 35, 15)
    );
    assert!(status.items_per_second > 0.0 && status.tokens_per_second > 0.0);
    assert_eq!(status.eta, None);

    let output = dir.join("out.jsonl");
    let summary = store
        .export(job, &output, Some(&dir.join("err.jsonl")), false)
        .unwrap();
    assert_eq!((summary.results, summary.errors), (5, 0));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["item-0", "item-1", "item-2", "item-3", "item-4"]);
    let chat = &lines[0];
    assert_eq!(chat["response"]["status_code"], 200);
    assert_eq!(chat["error"], serde_json::Value::Null);
    let body = &chat["response"]["body"];
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "smol");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], "answer to item-0");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["total_tokens"], 10);
    let text = &lines[1]["response"]["body"];
    assert_eq!(text["object"], "text_completion");
    assert_eq!(text["choices"][0]["text"], "answer to item-1");
    // No temporary file is left beside the outputs.
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
}

pub fn a_lost_lease_cannot_heartbeat_or_write_and_the_new_holder_wins(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut zombie = b.open();
    let mut other = b.open();
    let job = zombie
        .submit_file(&write_prompts(dir, "p.jsonl", 1), &SubmitOptions::new("m"))
        .unwrap()
        .job;

    let stale = zombie.claim(1, &lease(100)).unwrap().remove(0);
    assert!(
        other.claim(1, &lease(100)).unwrap().is_empty(),
        "a live lease is never taken"
    );
    sleep(Duration::from_millis(150));
    let fresh = other.claim(1, &lease(10_000)).unwrap().remove(0);
    // The lapse is not the item's fault (it was not alone): its attempt is given back.
    assert_eq!(
        (
            fresh.lease.item,
            fresh.lease.token,
            fresh.attempt,
            fresh.suspect
        ),
        (stale.lease.item, stale.lease.token + 1, 1, true)
    );

    assert_eq!(
        zombie
            .heartbeat(&[stale.lease], Duration::from_secs(60))
            .unwrap(),
        [LeaseStatus::Lost]
    );
    let error = zombie
        .complete(&stale.lease, &response_for(&stale))
        .unwrap_err();
    assert!(matches!(error, QueueError::LeaseLost { .. }), "{error}");
    assert!(matches!(
        zombie.fail(&stale.lease, &failure(true)),
        Err(QueueError::LeaseLost { .. })
    ));
    assert_eq!(zombie.release(&[stale.lease]).unwrap(), 0);

    other.complete(&fresh.lease, &response_for(&fresh)).unwrap();
    // A second output for the item is refused even with the right token.
    assert!(matches!(
        other.complete(&fresh.lease, &response_for(&fresh)),
        Err(QueueError::LeaseLost { .. })
    ));
    let items = other.items(job).unwrap();
    assert_eq!(
        (items[0].state, items[0].attempts),
        (ItemState::Completed, 1)
    );
    drop(other);
    b.check();
}

pub fn heartbeats_keep_a_lease_alive(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut worker = b.open();
    let mut thief = b.open();
    worker
        .submit_file(&write_prompts(dir, "p.jsonl", 1), &SubmitOptions::new("m"))
        .unwrap();
    let held = worker.claim(1, &lease(150)).unwrap().remove(0);
    for _ in 0..4 {
        sleep(Duration::from_millis(60));
        let status = worker
            .heartbeat(&[held.lease], Duration::from_millis(150))
            .unwrap();
        assert!(matches!(status[0], LeaseStatus::Held { .. }));
        assert!(thief.claim(1, &lease(150)).unwrap().is_empty());
    }
    worker.complete(&held.lease, &response_for(&held)).unwrap();
}

pub fn retryable_failures_back_off_until_max_attempts_then_fail_with_the_last_error(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open_fast();
    let options = SubmitOptions {
        max_attempts: 3,
        ..SubmitOptions::new("m")
    };
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", 1), &options)
        .unwrap()
        .job;

    for attempt in 1..=3 {
        let claimed = loop {
            if let Some(c) = store.claim(1, &ClaimOptions::default()).unwrap().pop() {
                break c;
            }
            sleep(Duration::from_millis(10));
        };
        assert_eq!(claimed.attempt, attempt);
        let outcome = store.fail(&claimed.lease, &failure(true)).unwrap();
        if attempt < 3 {
            let FailOutcome::Retrying { not_before, .. } = outcome else {
                panic!("{outcome:?}")
            };
            assert!(
                not_before > cortex_queue::now_ms(),
                "backoff is in the future"
            );
            assert!(
                store.claim(1, &ClaimOptions::default()).unwrap().is_empty(),
                "not claimable during backoff"
            );
        } else {
            assert_eq!(outcome, FailOutcome::Failed);
        }
    }
    let job_now = store.job(job).unwrap();
    assert_eq!(
        (job_now.state, job_now.counts.failed),
        (JobState::Failed, 1)
    );
    let item = &store.items(job).unwrap()[0];
    assert_eq!(
        (item.error_code.as_deref(), item.error_message.as_deref()),
        (Some("driver"), Some("decode failed"))
    );

    // Retry gives it fresh attempts.
    let (job_now, retried) = store.retry_failed(job).unwrap();
    assert_eq!((retried, job_now.state), (1, JobState::InProgress));
    let claimed = store.claim(1, &ClaimOptions::default()).unwrap().remove(0);
    assert_eq!(claimed.attempt, 1);
    store
        .complete(&claimed.lease, &response_for(&claimed))
        .unwrap();
    assert_eq!(store.job(job).unwrap().state, JobState::Completed);
}

pub fn a_non_retryable_failure_fails_at_once_and_is_exported_as_an_error(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 2);
    let claimed = store.claim(2, &ClaimOptions::default()).unwrap();
    let too_long = ItemFailure {
        code: "prompt_too_long".into(),
        message: "the prompt has 9000 tokens".into(),
        retryable: false,
    };
    assert_eq!(
        store.fail(&claimed[0].lease, &too_long).unwrap(),
        FailOutcome::Failed
    );
    store
        .complete(&claimed[1].lease, &response_for(&claimed[1]))
        .unwrap();
    assert_eq!(store.job(job).unwrap().state, JobState::Completed);

    let errors = dir.join("errors.jsonl");
    let summary = store
        .export(job, &dir.join("out.jsonl"), Some(&errors), false)
        .unwrap();
    assert_eq!((summary.results, summary.errors), (1, 1));
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&errors).unwrap().trim()).unwrap();
    assert_eq!(line["custom_id"], "item-0");
    assert_eq!(line["response"], serde_json::Value::Null);
    assert_eq!(line["error"]["code"], "prompt_too_long");
}

/// A job not done in its completion window expires: what finished is kept,
/// the rest (waiting or running) fails `batch_expired`, a running item's
/// lease is gone (its heartbeat says so and its result is refused), and
/// nothing more is claimed. Resuming runs the rest without a window.
pub fn a_job_past_its_window_expires_keeping_what_finished(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let options = SubmitOptions {
        completion_window: Some(CompletionWindow::new(Duration::from_millis(400))),
        ..SubmitOptions::new("m")
    };
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", 4), &options)
        .unwrap()
        .job;
    let submitted = store.job(job).unwrap();
    assert_eq!(
        submitted
            .times
            .expires_at
            .map(|t| t - submitted.times.created_at),
        Some(400)
    );
    let claimed = store.claim(2, &ClaimOptions::default()).unwrap();
    store
        .complete(&claimed[0].lease, &response_for(&claimed[0]))
        .unwrap();
    assert_eq!(store.job(job).unwrap().state, JobState::InProgress);

    sleep(Duration::from_millis(450));
    let expired = store.job(job).unwrap();
    assert_eq!(expired.state, JobState::Expired);
    assert!(expired.times.expired_at.is_some() && expired.state.is_terminal());
    assert_eq!((expired.counts.completed, expired.counts.failed), (1, 3));
    assert_eq!(
        store.progress(&[(claimed[1].lease, 5)]).unwrap(),
        [claimed[1].lease]
    );
    let status = store
        .heartbeat(&[claimed[1].lease], Duration::from_secs(60))
        .unwrap();
    assert_eq!(status, [LeaseStatus::Lost]);
    assert!(matches!(
        store.complete(&claimed[1].lease, &response_for(&claimed[1])),
        Err(QueueError::LeaseLost { .. })
    ));
    assert!(store.claim(4, &ClaimOptions::default()).unwrap().is_empty());

    let errors = dir.join("errors.jsonl");
    let summary = store
        .export(job, &dir.join("out.jsonl"), Some(&errors), false)
        .unwrap();
    assert_eq!((summary.results, summary.errors), (1, 3));
    for line in std::fs::read_to_string(&errors).unwrap().lines() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["error"]["code"], BATCH_EXPIRED, "{line}");
    }

    let (resumed, count) = store.resume(job).unwrap();
    assert_eq!((resumed.state, count), (JobState::InProgress, 3));
    assert_eq!(
        resumed.times.expires_at, None,
        "a resumed job runs to its end"
    );
    assert_eq!(store.claim(4, &ClaimOptions::default()).unwrap().len(), 3);
}

/// A job that names a URL has an event in the outbox the moment it ends
/// (in the same transaction), one per ending; deliverers take due events
/// under a lease, and a failed attempt is tried again after a backoff.
pub fn a_job_that_ends_has_its_webhook_event_in_the_outbox_until_delivered(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open();
    let notify = |name: &str| SubmitOptions {
        notify_url: Some(format!("http://127.0.0.1:9/{name}")),
        ..SubmitOptions::new(name)
    };
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", 2), &notify("done"))
        .unwrap()
        .job;
    let quiet = store
        .submit_file(
            &write_prompts(dir, "q.jsonl", 1),
            &SubmitOptions::new("quiet"),
        )
        .unwrap()
        .job;
    assert!(store.webhooks(job).unwrap().is_empty(), "nothing has ended");
    for claimed in store.claim(3, &ClaimOptions::default()).unwrap() {
        store
            .complete(&claimed.lease, &response_for(&claimed))
            .unwrap();
    }
    assert_eq!(
        store.job(job).unwrap().notify_url.as_deref(),
        Some("http://127.0.0.1:9/done")
    );
    assert!(
        store.webhooks(quiet).unwrap().is_empty(),
        "a job with no URL announces nothing"
    );
    let events = store.webhooks(job).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (
            events[0].kind.as_str(),
            events[0].url.as_str(),
            events[0].attempts
        ),
        ("batch.completed", "http://127.0.0.1:9/done", 0)
    );

    let lease = Duration::from_secs(60);
    let taken = store.claim_webhooks(10, lease).unwrap();
    assert_eq!(
        taken.iter().map(|e| e.id).collect::<Vec<_>>(),
        [events[0].id]
    );
    assert!(
        store.claim_webhooks(10, lease).unwrap().is_empty(),
        "held by its deliverer"
    );
    store.webhook_failed(taken[0].id, "HTTP 500").unwrap();
    assert!(
        store.claim_webhooks(10, lease).unwrap().is_empty(),
        "not due before its backoff"
    );
    sleep(Duration::from_millis(1100));
    let again = store.claim_webhooks(10, lease).unwrap();
    assert_eq!((again.len(), again[0].attempts), (1, 1));
    assert_eq!(again[0].last_error.as_deref(), Some("HTTP 500"));
    store.webhook_delivered(again[0].id).unwrap();
    let delivered = store.webhooks(job).unwrap().remove(0);
    assert!(delivered.delivered_at.is_some() && delivered.last_error.is_none());
    assert!(store.claim_webhooks(10, lease).unwrap().is_empty());

    // Every ending: a cancel, and a window that ends.
    let cancelled = store
        .submit_file(&write_prompts(dir, "c.jsonl", 1), &notify("cancel"))
        .unwrap()
        .job;
    store.cancel(cancelled).unwrap();
    let expiring = SubmitOptions {
        completion_window: Some(CompletionWindow::new(Duration::from_millis(50))),
        ..notify("expire")
    };
    let expired = store
        .submit_file(&write_prompts(dir, "e.jsonl", 1), &expiring)
        .unwrap()
        .job;
    sleep(Duration::from_millis(100));
    assert_eq!(store.job(expired).unwrap().state, JobState::Expired);
    let kinds: Vec<String> = store
        .claim_webhooks(10, lease)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["batch.cancelled", "batch.expired"]);
}

pub fn a_lone_poison_item_is_charged_only_for_deaths_while_alone(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open_fast();
    let options = SubmitOptions {
        max_attempts: 2,
        ..SubmitOptions::new("m")
    };
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", 1), &options)
        .unwrap()
        .job;
    // The first death is not charged (it was not known to run alone), nor
    // the first alone (the death before was not a lone run of it); the next
    // ones are deaths in a row while it runs alone, and are charged.
    for (attempt, suspect) in [(1, false), (1, true), (1, true), (2, true)] {
        let claimed = store.claim(1, &lease(50)).unwrap().remove(0);
        assert_eq!((claimed.attempt, claimed.suspect), (attempt, suspect));
        // Claimed, then never heard from again.
        sleep(Duration::from_millis(80));
    }
    assert!(store.claim(1, &lease(50)).unwrap().is_empty());
    let item = &store.items(job).unwrap()[0];
    assert_eq!(
        (item.state, item.error_code.as_deref(), item.attempts),
        (ItemState::Failed, Some("worker_lost"), 2)
    );
    let message = item.error_message.as_deref().unwrap();
    assert!(
        message.contains("alone") && message.contains("4 deaths"),
        "{message}"
    );
    assert_eq!(store.job(job).unwrap().state, JobState::Failed);
}

pub fn lone_suspects_take_turns_and_wait_for_a_workers_later_claim(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open_fast();
    let options = SubmitOptions {
        max_attempts: 5,
        ..SubmitOptions::new("m")
    };
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", 3), &options)
        .unwrap()
        .job;
    let first_claim = ClaimOptions {
        alone: false,
        ..lease(50)
    };
    let later_claim = lease(50);
    let claim = |store: &mut dyn Queue, options: &ClaimOptions| {
        let claimed = store.claim(1, options).unwrap().remove(0);
        (claimed.custom_id.clone(), claimed.alone, claimed)
    };
    let die = || sleep(Duration::from_millis(80));
    // A worker's first claim takes normal work while there is some.
    let (id, alone, _) = claim(store.as_mut(), &first_claim);
    assert_eq!((id.as_str(), alone), ("item-0", false));
    die();
    let (id, alone, _) = claim(store.as_mut(), &first_claim);
    assert_eq!((id.as_str(), alone), ("item-1", false));
    die();
    // Later claims run lone suspects, longest waiting first: a kill that
    // hit one alone sends it to the back.
    for expected in ["item-0", "item-1"] {
        let (id, alone, _) = claim(store.as_mut(), &later_claim);
        assert_eq!((id.as_str(), alone), (expected, true));
        die();
    }
    let (id, _, item) = claim(store.as_mut(), &later_claim);
    assert_eq!(id, "item-0");
    store.complete(&item.lease, &response_for(&item)).unwrap();
    let (id, alone, item) = claim(store.as_mut(), &first_claim);
    assert_eq!((id.as_str(), alone), ("item-2", false));
    store.complete(&item.lease, &response_for(&item)).unwrap();
    // With nothing else left, a first claim takes a lone suspect too.
    let (id, alone, item) = claim(store.as_mut(), &first_claim);
    assert_eq!((id.as_str(), alone), ("item-1", true));
    store.complete(&item.lease, &response_for(&item)).unwrap();
    let attempts: Vec<u32> = store
        .items(job)
        .unwrap()
        .iter()
        .map(|i| i.attempts)
        .collect();
    // No lone death followed one of the same item: nothing was charged.
    assert_eq!(attempts, [1, 1, 1]);
    assert_eq!(store.job(job).unwrap().state, JobState::Completed);
}

pub fn a_lone_suspect_whose_worker_died_waits_before_it_runs_alone_again(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open_with(RetryPolicy {
        lone_retry: Duration::from_millis(400),
        ..RetryPolicy::default()
    });
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 1);
    let die = || sleep(Duration::from_millis(80));
    assert!(!store.claim(1, &lease(50)).unwrap()[0].alone);
    die();
    // Its first lone run: the worker dies again.
    assert!(store.claim(1, &lease(50)).unwrap()[0].alone);
    die();
    // Not again until some worker has lived through the delay.
    assert!(store.claim(1, &lease(50)).unwrap().is_empty());
    assert_eq!(store.job(job).unwrap().counts.pending, 1);
    sleep(Duration::from_millis(400));
    let item = store.claim(1, &lease(50)).unwrap().remove(0);
    assert!(item.alone);
    store.complete(&item.lease, &response_for(&item)).unwrap();
    assert_eq!(store.job(job).unwrap().state, JobState::Completed);
}

/// A worker that claims up to `parallel` items, suspects only when idle,
/// and "dies" (lets its leases run out) whenever the poison item is among
/// them. Returns how many times it died.
fn work_with_poison(store: &mut dyn Queue, parallel: usize, poison: &str) -> usize {
    let mut deaths = 0;
    loop {
        let claimed = store.claim(parallel, &lease(40)).unwrap();
        if claimed.is_empty() {
            return deaths;
        }
        let suspects = claimed.iter().filter(|c| c.suspect).count();
        assert!(
            suspects == 0 || suspects == claimed.len(),
            "a suspect group mixed with others"
        );
        if claimed.iter().any(|c| c.custom_id == poison) {
            deaths += 1;
            sleep(Duration::from_millis(60));
            continue;
        }
        for item in &claimed {
            store.complete(&item.lease, &response_for(item)).unwrap();
        }
    }
}

pub fn a_poison_item_among_others_fails_alone_and_costs_the_others_no_attempts(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open_fast();
    let options = SubmitOptions {
        max_attempts: 3,
        ..SubmitOptions::new("m")
    };
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", 40), &options)
        .unwrap()
        .job;
    let deaths = work_with_poison(store.as_mut(), 16, "item-5");
    // Groups of 16, 8, 4, 2, then alone: once before the streak starts,
    // then three charged deaths in a row.
    assert_eq!(deaths, 4 + 1 + 3);
    let items = store.items(job).unwrap();
    for item in &items {
        if item.custom_id == "item-5" {
            assert_eq!((item.state, item.attempts), (ItemState::Failed, 3));
            assert_eq!(item.error_code.as_deref(), Some("worker_lost"));
        } else {
            assert_eq!(
                (item.state, item.attempts),
                (ItemState::Completed, 1),
                "{item:?}"
            );
        }
    }
    let job = store.job(job).unwrap();
    assert_eq!((job.counts.completed, job.counts.failed), (39, 1));
}

pub fn cancel_stops_pending_items_at_once_and_running_ones_at_their_heartbeat_then_resume_finishes(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 6);
    let done = store.claim(1, &ClaimOptions::default()).unwrap().remove(0);
    store.complete(&done.lease, &response_for(&done)).unwrap();
    let running = store.claim(2, &ClaimOptions::default()).unwrap();

    let cancelled = store.cancel(job).unwrap();
    assert_eq!(cancelled.state, JobState::Cancelling);
    assert_eq!(
        (
            cancelled.counts.cancelled,
            cancelled.counts.running,
            cancelled.counts.completed
        ),
        (3, 2, 1)
    );
    assert!(
        store
            .claim(10, &ClaimOptions::default())
            .unwrap()
            .is_empty()
    );

    // One worker hears of it at its heartbeat; the other finished just before and keeps its result.
    assert_eq!(
        store
            .heartbeat(&[running[0].lease], Duration::from_secs(60))
            .unwrap(),
        [LeaseStatus::Cancelled]
    );
    store
        .complete(&running[1].lease, &response_for(&running[1]))
        .unwrap();
    let job_now = store.job(job).unwrap();
    assert_eq!(
        (
            job_now.state,
            job_now.counts.completed,
            job_now.counts.cancelled
        ),
        (JobState::Cancelled, 2, 4)
    );
    assert!(job_now.times.cancelling_at.is_some() && job_now.times.cancelled_at.is_some());
    assert!(
        matches!(store.cancel(job), Ok(j) if j.state == JobState::Cancelled),
        "cancel twice is harmless"
    );

    // Resume: only the unfinished items run again.
    let (resumed, count) = store.resume(job).unwrap();
    assert_eq!((resumed.state, count), (JobState::InProgress, 4));
    let rest = store.claim(10, &ClaimOptions::default()).unwrap();
    assert_eq!(rest.len(), 4);
    for claimed in &rest {
        store
            .complete(&claimed.lease, &response_for(claimed))
            .unwrap();
    }
    let items = store.items(job).unwrap();
    assert!(
        items
            .iter()
            .all(|i| i.state == ItemState::Completed && i.attempts == 1),
        "{items:?}"
    );
    assert_eq!(store.job(job).unwrap().state, JobState::Completed);

    let error = store.resume(job).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("job {job} is completed: it finished; use retry to run its failed items again")
    );
    drop(store);
    b.check();
}

pub fn released_items_are_pending_again_without_using_an_attempt(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 2);
    let claimed = store.claim(2, &ClaimOptions::default()).unwrap();
    assert_eq!(store.job(job).unwrap().state, JobState::InProgress);
    let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
    assert_eq!(store.release(&leases).unwrap(), 2);
    let job_now = store.job(job).unwrap();
    assert_eq!(
        (job_now.state, job_now.counts.pending),
        (JobState::InProgress, 2)
    );
    let again = store.claim(2, &ClaimOptions::default()).unwrap();
    assert!(again.iter().all(|c| c.attempt == 1 && c.lease.token == 2));
}

pub fn higher_priority_jobs_are_claimed_first_and_claims_can_be_limited_to_jobs(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open();
    let low = submit_prompts(store.as_mut(), dir, "low.jsonl", 2);
    let options = SubmitOptions {
        priority: 5,
        ..SubmitOptions::new("m")
    };
    let high = store
        .submit_file(&write_prompts(dir, "high.jsonl", 3), &options)
        .unwrap()
        .job;
    let claimed = store.claim(4, &ClaimOptions::default()).unwrap();
    let jobs: Vec<_> = claimed.iter().map(|c| c.job).collect();
    assert_eq!(jobs, [low, high, high, high]); // sorted by item id; three of the high job, one low
    let only_low = ClaimOptions {
        jobs: Some(vec![low]),
        ..ClaimOptions::default()
    };
    let claimed = store.claim(4, &only_low).unwrap();
    assert_eq!(claimed.iter().map(|c| c.job).collect::<Vec<_>>(), [low]);

    let filter = JobFilter {
        state: Some(JobState::InProgress),
        ..JobFilter::default()
    };
    assert_eq!(store.jobs(&filter).unwrap().len(), 2);
    assert_eq!(
        store
            .jobs(&JobFilter {
                limit: Some(1),
                ..JobFilter::default()
            })
            .unwrap()[0]
            .id,
        high
    );
}

pub fn a_claim_by_a_worker_whose_outputs_vary_marks_only_its_jobs(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let kept = submit_prompts(store.as_mut(), dir, "kept.jsonl", 2);
    let varied = submit_prompts(store.as_mut(), dir, "varied.jsonl", 3);
    let claim = |jobs, same_output| ClaimOptions {
        jobs: Some(jobs),
        same_output,
        ..ClaimOptions::default()
    };
    assert_eq!(store.claim(2, &claim(vec![kept], true)).unwrap().len(), 2);
    assert!(!store.job(kept).unwrap().outputs_may_vary);
    assert!(!store.job(varied).unwrap().outputs_may_vary);
    // A worker that keeps no promise: only the job it claimed from is marked,
    // and a later claim by one that does never clears the mark.
    assert_eq!(
        store.claim(1, &claim(vec![varied], false)).unwrap().len(),
        1
    );
    assert_eq!(store.claim(1, &claim(vec![varied], true)).unwrap().len(), 1);
    assert!(!store.job(kept).unwrap().outputs_may_vary);
    assert!(store.job(varied).unwrap().outputs_may_vary);
    assert!(store.status(varied).unwrap().job.outputs_may_vary);
}

pub fn jobs_belong_to_a_project_and_list_by_it(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let plain = submit_prompts(store.as_mut(), dir, "plain.jsonl", 1);
    let input = write_prompts(dir, "alpha.jsonl", 2);
    let alpha = SubmitOptions {
        project: "alpha".into(),
        ..SubmitOptions::new("m")
    };
    let first = store.submit_file(&input, &alpha).unwrap().job;
    // The same file for the same parameters is a duplicate only within a project.
    assert!(matches!(
        store.submit_file(&input, &alpha),
        Err(QueueError::DuplicateJob { .. })
    ));
    let beta = SubmitOptions {
        project: "beta".into(),
        ..SubmitOptions::new("m")
    };
    let second = store.submit_file(&input, &beta).unwrap().job;
    assert_eq!(
        store.job(plain).unwrap().project,
        cortex_queue::DEFAULT_PROJECT
    );
    assert_eq!(store.job(first).unwrap().project, "alpha");
    let of = |store: &mut dyn Queue, project: &str| -> Vec<_> {
        let filter = JobFilter {
            project: Some(project.into()),
            ..JobFilter::default()
        };
        store.jobs(&filter).unwrap().iter().map(|j| j.id).collect()
    };
    assert_eq!(of(store.as_mut(), "alpha"), [first]);
    assert_eq!(of(store.as_mut(), "beta"), [second]);
    assert_eq!(of(store.as_mut(), "default"), [plain]);
    assert_eq!(store.jobs(&JobFilter::default()).unwrap().len(), 3);
}

pub fn export_refuses_a_running_job_unless_partial_and_never_leaves_half_a_file(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 3);
    let claimed = store.claim(1, &ClaimOptions::default()).unwrap().remove(0);
    store
        .complete(&claimed.lease, &response_for(&claimed))
        .unwrap();

    let output = dir.join("out.jsonl");
    std::fs::write(&output, "earlier export\n").unwrap();
    let error = store.export(job, &output, None, false).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "job {job} is in_progress: 1 of 3 requests are done; wait for it to finish, or export the partial results"
        )
    );
    assert_eq!(
        std::fs::read_to_string(&output).unwrap(),
        "earlier export\n"
    );

    let summary = store.export(job, &output, None, true).unwrap();
    assert_eq!(summary.results, 1);
    assert_eq!(std::fs::read_to_string(&output).unwrap().lines().count(), 1);

    let nowhere = dir.join("missing-dir").join("out.jsonl");
    let error = store.export(job, &nowhere, None, true).unwrap_err();
    assert!(
        error.to_string().starts_with(&format!(
            "cannot write {}: no file can be created in ",
            nowhere.display()
        )) && error.to_string().ends_with("nothing was written"),
        "{error}"
    );
    // Both files or neither: an errors file that cannot be written leaves
    // the output as it was.
    let before = std::fs::read_to_string(&output).unwrap();
    assert!(store.export(job, &output, Some(&nowhere), true).is_err());
    assert_eq!(std::fs::read_to_string(&output).unwrap(), before);
    assert!(
        !output
            .with_file_name(format!(".out.jsonl.{}.tmp", std::process::id()))
            .exists()
    );
    assert!(matches!(
        store.export(cortex_queue::JobId(99), &output, None, true),
        Err(QueueError::NoSuchJob(_))
    ));
}

pub fn status_reports_throughput_and_an_eta_while_running(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 10);
    for claimed in store.claim(4, &ClaimOptions::default()).unwrap() {
        store
            .complete(&claimed.lease, &response_for(&claimed))
            .unwrap();
    }
    let status = store.status(job).unwrap();
    assert_eq!(
        (status.job.counts.completed, status.job.counts.pending),
        (4, 6)
    );
    assert!(status.items_per_second > 0.0);
    let eta = status.eta.expect("an ETA while items remain");
    assert!(eta > Duration::ZERO);
}

/// A job's status counts tokens as running items report them, not only
/// when items finish; a report under a lease no longer held counts nothing,
/// and a new claim starts the item's count again.
pub fn status_counts_the_tokens_of_running_items_as_they_are_reported(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 4);
    let running = store.claim(2, &ClaimOptions::default()).unwrap();
    let (a, b_item) = (&running[0], &running[1]);
    let status = store.status(job).unwrap();
    assert_eq!((status.running_tokens, status.tokens_per_second), (0, 0.0));
    assert_eq!(status.eta, None, "nothing generated yet: no ETA");

    sleep(Duration::from_millis(20));
    store.progress(&[(a.lease, 5), (b_item.lease, 7)]).unwrap();
    let status = store.status(job).unwrap();
    assert_eq!(status.running_tokens, 12);
    assert_eq!(status.job.completion_tokens, 0);
    assert!(status.tokens_per_second > 0.0, "{status:?}");
    assert_eq!(status.eta, None, "no item finished: no length to go by");

    store.release(&[b_item.lease]).unwrap();
    assert_eq!(
        store.progress(&[(b_item.lease, 100)]).unwrap(),
        [b_item.lease],
        "a report under a lease no longer held says so"
    );
    assert_eq!(
        store.status(job).unwrap().running_tokens,
        5,
        "a stale lease counts nothing"
    );
    let again = store.claim(1, &ClaimOptions::default()).unwrap().remove(0);
    assert_eq!(again.custom_id, b_item.custom_id);
    assert_eq!(
        store.status(job).unwrap().running_tokens,
        5,
        "a new claim starts from zero"
    );

    store.complete(&a.lease, &response_for(a)).unwrap();
    store.progress(&[(again.lease, 2)]).unwrap();
    let status = store.status(job).unwrap();
    assert_eq!(
        (status.running_tokens, status.job.completion_tokens),
        (2, 3)
    );
    // Three items to go, as long as the finished one (3 tokens), less the 2 made.
    let eta = status.eta.expect("an ETA once an item has finished");
    let expected = 7.0 / status.tokens_per_second;
    assert!(
        (eta.as_secs_f64() - expected).abs() < 1e-6,
        "{eta:?} vs {expected}"
    );
}

/// What a dashboard reads: pages of items filtered by state and `custom_id`,
/// one item whole (with where it ran), the latencies of results, and the
/// workers with their heartbeat and items in flight.
pub fn items_page_and_inspect_with_their_runs_and_latencies(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open_fast();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 12);
    let claimed = store.claim(3, &ClaimOptions::default()).unwrap();
    let mut timed = response_for(&claimed[0]);
    timed.timings.first_token = Some(Duration::from_millis(40));
    timed.timings.finished = Duration::from_millis(250);
    store.complete(&claimed[0].lease, &timed).unwrap();
    store.fail(&claimed[1].lease, &failure(false)).unwrap();

    let page = |store: &mut dyn Queue, query: ItemQuery| store.item_page(job, &query).unwrap();
    let all = page(
        store.as_mut(),
        ItemQuery {
            limit: 5,
            ..ItemQuery::default()
        },
    );
    assert_eq!(all.matching, 12);
    assert_eq!(
        all.items.iter().map(|i| i.line).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    let second = page(
        store.as_mut(),
        ItemQuery {
            limit: 5,
            offset: 10,
            ..ItemQuery::default()
        },
    );
    assert_eq!(
        second.items.iter().map(|i| i.line).collect::<Vec<_>>(),
        [11, 12]
    );
    let failed = page(
        store.as_mut(),
        ItemQuery {
            state: Some(ItemState::Failed),
            limit: 50,
            ..ItemQuery::default()
        },
    );
    assert_eq!(
        (failed.matching, failed.items[0].custom_id.as_str()),
        (1, "item-1")
    );
    let searched = page(
        store.as_mut(),
        ItemQuery {
            custom_id: Some("item-1".into()),
            limit: 50,
            ..ItemQuery::default()
        },
    );
    // item-1, item-10, item-11
    assert_eq!(searched.matching, 3);

    let done = store.item(job, 1).unwrap();
    assert_eq!(done.record.state, ItemState::Completed);
    assert_eq!(done.record.duration_ms, Some(250));
    assert_eq!(done.record.completion_tokens, Some(3));
    let ran_by = done.record.ran_by.clone().expect("the worker it ran on");
    assert!(
        ran_by.ends_with(&format!(" pid {}", std::process::id())),
        "{ran_by}"
    );
    assert_eq!(done.endpoint, "/v1/chat/completions");
    assert!(
        done.request.to_string().contains("Question 0?"),
        "{}",
        done.request
    );
    let response = done.response.expect("its result");
    assert!(
        response.to_string().contains("answer to item-0"),
        "{response}"
    );
    let lost = store.item(job, 2).unwrap();
    assert_eq!(lost.record.error_code.as_deref(), Some("driver"));
    assert!(lost.response.is_none() && lost.record.ran_by.is_some());
    assert!(matches!(
        store.item(job, 99),
        Err(QueueError::NoSuchItem { line: 99, .. })
    ));

    let samples = store.completions(job).unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(
        (samples[0].first_token_ms, samples[0].duration_ms),
        (Some(40), Some(250))
    );

    let workers = store.workers().unwrap();
    assert_eq!(workers.len(), 1, "{workers:?}");
    assert_eq!(workers[0].pid, std::process::id());
    assert_eq!(workers[0].running, 1);
    assert!(workers[0].heartbeat_at.is_some() && !workers[0].host.contains('/'));
    store.unregister_worker().unwrap();
}

/// A page of jobs: filtered by model (and state) in the query, counted in
/// all, with every model of the project to choose from.
pub fn job_pages_filter_by_model_and_count_every_match(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let mut submit = |name: &str, model: &str, project: &str| {
        let input = write_prompts(dir, name, 2);
        let options = SubmitOptions {
            project: project.into(),
            // The files hold the same lines: each is a job of its own.
            force: true,
            ..SubmitOptions::new(model)
        };
        store.submit_file(&input, &options).unwrap().job
    };
    let oldest = submit("a1.jsonl", "alpha-model", "p");
    let _beta = submit("b1.jsonl", "beta-model", "p");
    let newest = submit("a2.jsonl", "alpha-model", "p");
    let _elsewhere = submit("c1.jsonl", "gamma-model", "other");
    let page = |store: &mut dyn Queue, model: Option<&str>, offset: usize, limit: usize| {
        store
            .job_page(&JobFilter {
                project: Some("p".into()),
                model: model.map(Into::into),
                offset,
                limit: Some(limit),
                ..JobFilter::default()
            })
            .unwrap()
    };
    let first = page(store.as_mut(), Some("alpha-model"), 0, 1);
    assert_eq!(first.matching, 2);
    assert_eq!(
        first.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        [newest]
    );
    assert_eq!(first.models, ["alpha-model", "beta-model"]);
    let second = page(store.as_mut(), Some("alpha-model"), 1, 1);
    assert_eq!(
        second.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        [oldest]
    );
    let all = page(store.as_mut(), None, 0, 10);
    assert_eq!((all.matching, all.jobs.len()), (3, 3));
    let none = page(store.as_mut(), Some("gamma-model"), 0, 10);
    assert_eq!((none.matching, none.jobs.len()), (0, 0));
    let done = store
        .job_page(&JobFilter {
            state: Some(JobState::Completed),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!(done.matching, 0);
    assert_eq!(done.models.len(), 3, "{:?}", done.models);
}

/// A job that carries its destination has an `export` row in the outbox
/// when it ends, beside its webhook event, taken the same way.
pub fn a_job_that_carries_its_destination_has_an_export_in_the_outbox_when_it_ends(
    b: &dyn DriverUnderTest,
) {
    let dir = b.scratch();
    let mut store = b.open();
    let both = SubmitOptions {
        notify_url: Some("http://127.0.0.1:9/hook".into()),
        output_url: Some("s3://bucket/out.parquet".into()),
        ..SubmitOptions::new("both")
    };
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", 1), &both)
        .unwrap()
        .job;
    assert_eq!(
        store.job(job).unwrap().output_url.as_deref(),
        Some("s3://bucket/out.parquet")
    );
    assert!(store.webhooks(job).unwrap().is_empty(), "nothing has ended");
    for claimed in store.claim(1, &ClaimOptions::default()).unwrap() {
        store
            .complete(&claimed.lease, &response_for(&claimed))
            .unwrap();
    }
    let rows: Vec<(String, String)> = store
        .webhooks(job)
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.url))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.contains(&("batch.completed".into(), "http://127.0.0.1:9/hook".into())));
    assert!(rows.contains(&(EXPORT_EVENT.into(), "s3://bucket/out.parquet".into())));
    let taken = store.claim_webhooks(10, Duration::from_secs(60)).unwrap();
    assert_eq!(taken.len(), 2);

    // Only a destination: only the export.
    let only = SubmitOptions {
        output_url: Some("/tmp/out.jsonl".into()),
        ..SubmitOptions::new("only")
    };
    let job = store
        .submit_file(&write_prompts(dir, "q.jsonl", 1), &only)
        .unwrap()
        .job;
    store.cancel(job).unwrap();
    let kinds: Vec<String> = store
        .webhooks(job)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, [EXPORT_EVENT]);
}
