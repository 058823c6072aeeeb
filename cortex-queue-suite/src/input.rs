//! Submitting input files: both formats, every kind of bad line, all-or-nothing
//! and skip-invalid, duplicate detection.

use crate::{DriverUnderTest, write_prompts};
use cortex_openai::{ExportJsonl, SubmitJsonl};
use cortex_queue::{ItemQuery, ItemState, JobFilter, JobState, QueueError, SubmitOptions};

/// One file with every defect DESIGN.md lists, around good lines (a BOM on
/// the first, a CRLF ending on the second) that must survive.
fn every_bad_line() -> Vec<u8> {
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    let lines: [&[u8]; 17] = [
        br#"{"custom_id": "a1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}}"#,
        b"{\"prompt\": \"Once upon a time\", \"temperature\": 0.5}\r",
        b"",
        br#"{"prompt": "x", "max_tokens": 4"#,
        br#"{"max_tokens": 4}"#,
        br#"{"prompt": ""}"#,
        br#"{"custom_id": "e1", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}}"#,
        br#"{"custom_id": "g1", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x"}}"#,
        br#"{"prompt": "x", "temperature": -1}"#,
        b"{\"prompt\": \"caf\xE9\"}",
        br#"{"custom_id": "a1", "prompt": "again"}"#,
        br#"{"prompt": "x", "tempurature": 0.5}"#,
        br#"{"messages": []}"#,
        br#"{"custom_id": "b1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "top_p": 0}}"#,
        br#"[1, 2, 3]"#,
        br#"{"prompt": "x", "stop": 7}"#,
        br#"{"prompt": "the last line is cut"#,
    ];
    for (i, line) in lines.iter().enumerate() {
        bytes.extend_from_slice(line);
        if i + 1 < lines.len() {
            bytes.push(b'\n');
        }
    }
    bytes
}

pub fn all_or_nothing_reports_every_bad_line_and_stores_nothing(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let before = write_prompts(dir, "good.jsonl", 3);
    let kept = store
        .submit_file(&before, &SubmitOptions::new("m"))
        .unwrap();

    let error = store
        .submit_reader(
            every_bad_line().as_slice(),
            "bad.jsonl",
            &SubmitOptions::new("m"),
        )
        .unwrap_err();
    assert_eq!(error.code(), "invalid_input");
    assert_eq!(
        error.to_string().trim_end(),
        include_str!("expected/bad_lines_report.txt").trim_end()
    );

    // Nothing of the bad file is visible; the earlier job is untouched.
    let jobs = store.jobs(&JobFilter::default()).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, kept.job);
    assert_eq!(jobs[0].counts.pending, 3);
    b.check();
}

pub fn skip_invalid_keeps_good_lines_and_records_bad_ones_as_failed(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let options = SubmitOptions {
        skip_invalid: true,
        ..SubmitOptions::new("m")
    };
    let submitted = store
        .submit_reader(every_bad_line().as_slice(), "bad.jsonl", &options)
        .unwrap();
    assert_eq!((submitted.items, submitted.invalid), (2, 14));
    let job = store.job(submitted.job).unwrap();
    assert_eq!(job.state, JobState::InProgress);
    assert_eq!(
        (
            job.counts.total,
            job.counts.pending,
            job.counts.failed,
            job.counts.invalid
        ),
        (16, 2, 14, 14)
    );

    let items = store.items(submitted.job).unwrap();
    let ids: Vec<(u64, &str)> = items
        .iter()
        .map(|i| (i.line, i.custom_id.as_str()))
        .collect();
    assert_eq!(ids, [(1, "a1"), (2, "2")]);

    // Where items are shown, the refused lines are failed items with their
    // line and error, in line order among the others.
    let all = ItemQuery {
        limit: 100,
        ..ItemQuery::default()
    };
    let page = store.item_page(submitted.job, &all).unwrap();
    assert_eq!(page.matching, 16);
    let lines: Vec<u64> = page.items.iter().map(|i| i.line).collect();
    // Line 3 is blank: no item.
    let expected: Vec<u64> = (1..=17).filter(|&l| l != 3).collect();
    assert_eq!(lines, expected);
    let failed = ItemQuery {
        state: Some(ItemState::Failed),
        limit: 5,
        offset: 2,
        ..ItemQuery::default()
    };
    let page = store.item_page(submitted.job, &failed).unwrap();
    assert_eq!(page.matching, 14);
    assert_eq!(page.items.len(), 5);
    assert!(
        page.items.iter().all(|i| i.state == ItemState::Failed
            && i.error_code.as_deref() == Some("invalid_input")
            && i.error_message.as_deref().is_some_and(|m| !m.is_empty())),
        "{page:?}"
    );
    let refused = page.items[0].line;
    let detail = store.item(submitted.job, refused).unwrap();
    assert_eq!(detail.record.line, refused);
    assert_eq!(detail.record.state, ItemState::Failed);
    assert!(detail.response.is_none());

    // The error file lists the bad lines by number, in order, even before the job ends.
    let errors = dir.join("errors.jsonl");
    store
        .export(submitted.job, &dir.join("out.jsonl"), Some(&errors), true)
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&errors).unwrap().trim_end(),
        include_str!("expected/bad_lines_errors.jsonl").trim_end()
    );
}

pub fn empty_and_blank_files_are_rejected(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    for (name, text) in [("empty.jsonl", ""), ("blank.jsonl", "\n  \r\n\n")] {
        let error = store
            .submit_reader(text.as_bytes(), name, &SubmitOptions::new("m"))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("{name}: no requests in the file; nothing was submitted")
        );
    }
    let missing = store
        .submit_file(&dir.join("nope.jsonl"), &SubmitOptions::new("m"))
        .unwrap_err();
    assert!(matches!(missing, QueueError::Io { .. }));
    assert!(missing.to_string().contains("nope.jsonl"), "{missing}");
    assert!(store.jobs(&JobFilter::default()).unwrap().is_empty());
}

pub fn the_same_file_and_parameters_twice_is_reported_unless_forced(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let file = write_prompts(dir, "p.jsonl", 4);
    let first = store.submit_file(&file, &SubmitOptions::new("m")).unwrap();

    let again = store
        .submit_file(&file, &SubmitOptions::new("m"))
        .unwrap_err();
    match &again {
        QueueError::DuplicateJob {
            existing, state, ..
        } => assert_eq!((*existing, *state), (first.job, JobState::InProgress)),
        other => panic!("expected a duplicate, got {other}"),
    }
    assert!(
        again.to_string().contains(&format!("as job {}", first.job)),
        "{again}"
    );

    // Other parameters make it another job; so does force.
    let mut other = SubmitOptions::new("m");
    other.defaults.stop.max_tokens = 5;
    store.submit_file(&file, &other).unwrap();
    store
        .submit_file(
            &file,
            &SubmitOptions {
                force: true,
                ..SubmitOptions::new("m")
            },
        )
        .unwrap();
    assert_eq!(store.jobs(&JobFilter::default()).unwrap().len(), 3);
}

pub fn a_job_records_its_source_model_defaults_and_metadata(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let file = write_prompts(dir, "p.jsonl", 2);
    let mut options = SubmitOptions::new("SmolLM2");
    options.metadata.insert("team".into(), "search".into());
    options.defaults.stop.max_tokens = 7;
    options.priority = 3;
    let job = store.submit_file(&file, &options).unwrap().job;
    let job = store.job(job).unwrap();
    assert_eq!(job.source_name, file.display().to_string());
    assert_eq!(job.source_sha256.len(), 64);
    assert_eq!(
        (
            job.model.as_str(),
            job.priority,
            job.defaults.stop.max_tokens
        ),
        ("SmolLM2", 3, 7)
    );
    assert!(job.times.validating_at.is_some() && job.times.in_progress_at.is_some());

    let filter = JobFilter {
        metadata: Some(("team".into(), "search".into())),
        ..JobFilter::default()
    };
    assert_eq!(store.jobs(&filter).unwrap().len(), 1);
    let filter = JobFilter {
        metadata: Some(("team".into(), "ads".into())),
        ..JobFilter::default()
    };
    assert!(store.jobs(&filter).unwrap().is_empty());
}

pub fn a_jobs_shared_grammar_is_stored_once_and_comes_back_with_each_item(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let mut store = b.open();
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}"#;
    let text: String = (0..50)
        .map(|i| {
            format!(
                r#"{{"custom_id": "s{i}", "method": "POST", "url": "/v1/chat/completions", "body": {{"messages": [{{"role": "user", "content": "Person {i}"}}], "response_format": {{"type": "json_schema", "json_schema": {{"name": "p", "schema": {schema}}}}}}}}}"#
            ) + "\n"
        })
        .collect();
    let file = dir.join("s.jsonl");
    std::fs::write(&file, text).unwrap();
    store.submit_file(&file, &SubmitOptions::new("m")).unwrap();
    let (grammars, longest) = b.stored_grammars_and_longest_request();
    assert_eq!(grammars, 1);
    // The prompt and a 64-digit reference, not the grammar.
    assert!(longest < 200, "{longest} bytes");
    let claimed = store
        .claim(50, &cortex_queue::ClaimOptions::default())
        .unwrap();
    assert_eq!(claimed.len(), 50);
    let expected =
        cortex_grammar::from_json_schema(&serde_json::from_str(schema).unwrap()).unwrap();
    assert!(
        claimed
            .iter()
            .all(|c| c.request.as_generate().unwrap().grammar.as_deref() == Some(expected.as_str()))
    );
}
