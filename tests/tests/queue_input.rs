//! Submitting input files: both formats, every kind of bad line, all-or-nothing
//! and skip-invalid, duplicate detection.

#[macro_use]
mod queue_common;

use cortex_openai::{Endpoint, ExportJsonl, SubmitJsonl, parse_line};
use cortex_queue::{
    ItemQuery, ItemState, JobDefaults, JobFilter, JobState, QueueError, SubmitOptions,
};
use cortex_request::{ChatMessage, Prompt};
use queue_common::Driver;

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

fn all_or_nothing_reports_every_bad_line_and_stores_nothing(b: &Driver) {
    let dir = &b.dir;
    let mut store = b.open();
    let before = queue_common::write_prompts(dir.path(), "good.jsonl", 3);
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
    // One snapshot per driver, with the same content: the report does not depend on the store.
    insta::with_settings!({ snapshot_suffix => b.name() }, {
        insta::assert_snapshot!(error.to_string());
    });

    // Nothing of the bad file is visible; the earlier job is untouched.
    let jobs = store.jobs(&JobFilter::default()).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, kept.job);
    assert_eq!(jobs[0].counts.pending, 3);
    b.check();
}

fn skip_invalid_keeps_good_lines_and_records_bad_ones_as_failed(b: &Driver) {
    let dir = &b.dir;
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
    let errors = dir.path().join("errors.jsonl");
    store
        .export(
            submitted.job,
            &dir.path().join("out.jsonl"),
            Some(&errors),
            true,
        )
        .unwrap();
    insta::with_settings!({ snapshot_suffix => b.name() }, {
        insta::assert_snapshot!(std::fs::read_to_string(&errors).unwrap());
    });
}

#[test]
fn both_formats_parse_with_their_fields_and_job_defaults() {
    let mut defaults = JobDefaults::default();
    defaults.stop.max_tokens = 99;
    defaults.sampling.temperature = 0.25;

    let chat = parse_line(
        3,
        r#"{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-x", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 12, "top_k": -1, "seed": 5, "stop": ["\n"], "logit_bias": {"42": -100}, "priority": 2}}"#,
        &defaults,
    )
    .unwrap();
    assert_eq!(chat.endpoint, Endpoint::ChatCompletions.url());
    assert_eq!(chat.model.as_deref(), Some("gpt-x"));
    assert_eq!(
        chat.request.as_generate().unwrap().prompt,
        Prompt::Chat(vec![
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hi")
        ])
    );
    let r = chat.request.as_generate().unwrap();
    assert_eq!(
        (
            r.stop.max_tokens,
            r.sampling.temperature,
            r.sampling.top_k,
            r.sampling.seed
        ),
        (12, 0.25, 0, Some(5))
    );
    assert_eq!(
        (
            r.stop.stop.clone(),
            r.sampling.logit_bias.get(&42).copied(),
            r.priority
        ),
        (vec!["\n".to_owned()], Some(-100.0), 2)
    );

    let plain = parse_line(
        9,
        r#"{"prompt": [1, 2, 3], "temperature": 0, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": true, "stop_token_ids": [2], "n": 2}"#,
        &defaults,
    )
    .unwrap();
    assert_eq!(
        (plain.custom_id.as_str(), plain.endpoint.as_str()),
        ("9", Endpoint::Completions.url())
    );
    assert_eq!(
        plain.request.as_generate().unwrap().prompt,
        Prompt::Tokens(vec![1, 2, 3])
    );
    let r = plain.request.as_generate().unwrap();
    assert_eq!(
        (
            r.stop.max_tokens,
            r.sampling.temperature,
            r.sampling.min_p,
            r.n
        ),
        (99, 0.0, 0.1, 2)
    );
    assert!(r.stop.ignore_eos);
    assert_eq!(r.stop.stop_token_ids, [2]);
}

fn empty_and_blank_files_are_rejected(b: &Driver) {
    let dir = &b.dir;
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
        .submit_file(&dir.path().join("nope.jsonl"), &SubmitOptions::new("m"))
        .unwrap_err();
    assert!(matches!(missing, QueueError::Io { .. }));
    assert!(missing.to_string().contains("nope.jsonl"), "{missing}");
    assert!(store.jobs(&JobFilter::default()).unwrap().is_empty());
}

fn the_same_file_and_parameters_twice_is_reported_unless_forced(b: &Driver) {
    let dir = &b.dir;
    let mut store = b.open();
    let file = queue_common::write_prompts(dir.path(), "p.jsonl", 4);
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

fn a_job_records_its_source_model_defaults_and_metadata(b: &Driver) {
    let dir = &b.dir;
    let mut store = b.open();
    let file = queue_common::write_prompts(dir.path(), "p.jsonl", 2);
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

fn a_jobs_shared_grammar_is_stored_once_and_comes_back_with_each_item(b: &Driver) {
    let dir = &b.dir;
    let mut store = b.open();
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}"#;
    let text: String = (0..50)
        .map(|i| {
            format!(
                r#"{{"custom_id": "s{i}", "method": "POST", "url": "/v1/chat/completions", "body": {{"messages": [{{"role": "user", "content": "Person {i}"}}], "response_format": {{"type": "json_schema", "json_schema": {{"name": "p", "schema": {schema}}}}}}}}}"#
            ) + "\n"
        })
        .collect();
    let file = dir.path().join("s.jsonl");
    std::fs::write(&file, text).unwrap();
    store.submit_file(&file, &SubmitOptions::new("m")).unwrap();
    let (grammars, longest) = queue_common::sql_pair(
        b,
        "SELECT count(*) FROM grammars",
        "SELECT max(length(request)) FROM items",
    );
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

on_both_drivers!(
    all_or_nothing_reports_every_bad_line_and_stores_nothing,
    skip_invalid_keeps_good_lines_and_records_bad_ones_as_failed,
    empty_and_blank_files_are_rejected,
    the_same_file_and_parameters_twice_is_reported_unless_forced,
    a_job_records_its_source_model_defaults_and_metadata,
    a_jobs_shared_grammar_is_stored_once_and_comes_back_with_each_item,
);
