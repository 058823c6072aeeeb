//! `cortex_openai::check_batch`, which a server runs on an uploaded batch
//! file before it takes its store, says exactly what submitting it would
//! say: the same lines refused with the same messages (bad JSON, a wrong
//! endpoint, a duplicate `custom_id`), and a good file accepted whole.

use cortex_openai::{BatchRequest, SubmitJsonl, check_batch};
use cortex_queue::{QueueError, SubmitOptions};
use cortex_tests::Cortex;

fn line(id: &str, url: &str) -> String {
    format!(
        r#"{{"custom_id":"{id}","method":"POST","url":"{url}","body":{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":2}}}}"#
    )
}

fn batch() -> BatchRequest {
    BatchRequest::parse(br#"{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h"}"#)
        .expect("a batch request")
}

#[test]
fn the_check_and_the_submit_refuse_the_same_lines_alike() {
    let cortex = Cortex::new();
    let bad = [
        line("a", "/v1/chat/completions"),
        "{not json".to_owned(),
        line("b", "/v1/completions"),
        line("a", "/v1/chat/completions"),
        line("c", "/v1/chat/completions"),
        line("c", "/v1/chat/completions"),
        String::new(),
        r#"{"custom_id":"d","method":"POST","url":"/v1/chat/completions","body":{"messages":[],"max_tokens":-1}}"#.to_owned(),
    ]
    .join("\n");
    let options = SubmitOptions::new("m");
    let checked = check_batch(bad.as_bytes(), "in.jsonl", &options, &batch());
    std::fs::create_dir_all(cortex.dir().join("data")).unwrap();
    let mut store = cortex.store();
    let submitted = store.submit_batch(bad.as_bytes(), "in.jsonl", &options, &batch());
    let (Err(QueueError::InvalidInput(checked)), Err(QueueError::InvalidInput(submitted))) =
        (checked, submitted)
    else {
        panic!("both must refuse the file");
    };
    assert_eq!(checked.lines, submitted.lines);
    assert_eq!(checked.errors, submitted.errors);
    assert_eq!(checked.to_string(), submitted.to_string());
    let lines: Vec<u64> = checked.errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [2, 3, 4, 6, 8], "{checked}");
    assert!(
        checked.errors[2].message.contains("first used on line 1"),
        "{checked}"
    );
    // Nothing was stored by the refused submit.
    assert!(store.jobs(&Default::default()).unwrap().is_empty());

    let good = (0..5)
        .map(|n| line(&format!("g{n}"), "/v1/chat/completions"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        check_batch(good.as_bytes(), "good.jsonl", &options, &batch()).unwrap(),
        5
    );
    let stored = store
        .submit_batch(good.as_bytes(), "good.jsonl", &options, &batch())
        .unwrap();
    assert_eq!(stored.items, 5);

    let empty = check_batch(&b"\n\n"[..], "empty.jsonl", &options, &batch());
    assert!(
        matches!(&empty, Err(QueueError::InvalidInput(r)) if r.errors.is_empty() && r.lines == 0),
        "{empty:?}"
    );
}
