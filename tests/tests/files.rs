//! The server's files directory over HTTP: uploads streamed to disk and
//! counted against a per-project quota (413 beyond, nothing left behind),
//! listings paged from the index, content streamed back whole, abandoned
//! temporary files and orphaned content swept at start, failed batches and
//! exports past the retention pruned, and all of it the same after a restart;
//! and the attempts a job made from an uploaded file (or a submitted one) gets.

use std::path::Path;
use std::time::{Duration, SystemTime};

use cortex_tests::{Cortex, Server, raw_http};
use serde_json::Value;

const BOUNDARY: &str = "cortex-test-boundary";

/// Uploads `content` as a batch input; the status and the JSON answer.
fn upload(port: u16, name: &str, content: &[u8]) -> (u16, Value) {
    let mut body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/jsonl\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    let mut request = format!(
        "POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let (status, text) = raw_http(port, request).expect("the server answers an upload");
    (status, json_body(&text))
}

fn get(port: u16, path: &str) -> (u16, String) {
    raw_http(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
    )
    .expect("the server answers")
}

fn json_body(response: &str) -> Value {
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {response}"))
}

/// `bytes` of JSONL: one chat request per line.
fn jsonl(bytes: usize, tag: &str) -> Vec<u8> {
    let mut text = String::new();
    let mut n = 0;
    while text.len() < bytes {
        text.push_str(&format!(
            "{{\"custom_id\":\"{tag}-{n}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{{\"messages\":[{{\"role\":\"user\",\"content\":\"hello {n}\"}}],\"max_tokens\":2}}}}\n"
        ));
        n += 1;
    }
    text.into_bytes()
}

/// Every id of `/v1/files`, paged `limit` at a time.
fn all_file_ids(port: u16, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after = String::new();
    loop {
        let (status, text) = get(port, &format!("/v1/files?limit={limit}{after}"));
        assert_eq!(status, 200, "{text}");
        let page = json_body(&text);
        let data = page["data"].as_array().expect("a list").clone();
        assert!(data.len() <= limit, "{page}");
        ids.extend(data.iter().map(|f| f["id"].as_str().unwrap().to_owned()));
        if page["has_more"] != true {
            return ids;
        }
        after = format!("&after={}", ids.last().unwrap());
    }
}

fn set_age(path: &Path, age: Duration) {
    let file = std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open to age it");
    file.set_modified(SystemTime::now() - age)
        .expect("set the modification time");
}

#[test]
fn uploads_are_streamed_counted_paged_swept_and_pruned() {
    let cortex = Cortex::new();
    let files = cortex.dir().join("data").join("cortex.files");
    for sub in ["batches", "exports"] {
        std::fs::create_dir_all(files.join(sub)).unwrap();
    }
    // What crashed writers left: temporary files of processes that are gone
    // (pids above Linux's maximum), an upload's content without its record.
    let abandoned = [
        files.join(".file-a.jsonl.99999999.tmp"),
        files.join("file-b.tmp.99999998"),
        files
            .join("exports")
            .join(".batch_3-1-output.jsonl.99999997.tmp"),
        files.join("file-orphan.jsonl"),
    ];
    for path in &abandoned {
        std::fs::write(path, "partial").unwrap();
    }
    // A temporary file of a live process (this one) is left alone.
    let live = files.join(format!(".file-c.jsonl.{}.tmp", std::process::id()));
    std::fs::write(&live, "being written").unwrap();
    // An upload from before (default project), and failed batches and an
    // export, old and new.
    let old_upload = jsonl(100, "old");
    std::fs::write(files.join("file-old.jsonl"), &old_upload).unwrap();
    std::fs::write(
        files.join("file-old.json"),
        serde_json::json!({"id": "file-old", "bytes": old_upload.len(), "created_at": 1_600_000_000,
                           "filename": "old.jsonl", "purpose": "batch"})
        .to_string(),
    )
    .unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (id, created) in [
        ("batch_failed_old", 1_600_000_000),
        ("batch_failed_new", now),
    ] {
        let batch = serde_json::json!({"id": id, "object": "batch", "status": "failed",
                                       "created_at": created, "endpoint": "/v1/chat/completions"});
        std::fs::write(
            files.join("batches").join(format!("{id}.json")),
            serde_json::json!({"project": "default", "batch": batch}).to_string(),
        )
        .unwrap();
    }
    let old_export = files.join("exports").join("batch_9-1-output.jsonl");
    let new_export = files.join("exports").join("batch_9-2-output.jsonl");
    std::fs::write(&old_export, "{}\n").unwrap();
    std::fs::write(&new_export, "{}\n").unwrap();
    set_age(&old_export, Duration::from_secs(3 * 24 * 3600));

    let quota = 3 * (4 << 20);
    let quota_text = quota.to_string();
    let args = [
        "--max-project-file-bytes",
        quota_text.as_str(),
        "--file-retention-days",
        "1",
    ];
    let mut server = Server::start(&cortex, &args);
    let port = server.port;

    for path in &abandoned {
        assert!(!path.exists(), "{} was not swept", path.display());
    }
    assert!(live.exists(), "a live writer's temporary file was swept");
    // Pruning runs as the server starts; give it a moment.
    let started = std::time::Instant::now();
    while old_export.exists() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!old_export.exists(), "an export past the retention stayed");
    assert!(new_export.exists(), "a recent export was pruned");
    let (_, batches) = get(port, "/v1/batches?limit=100");
    assert!(batches.contains("batch_failed_new"), "{batches}");
    assert!(!batches.contains("batch_failed_old"), "{batches}");
    assert!(!files.join("batches/batch_failed_old.json").exists());

    // Three uploads of 4 MiB fill the quota with the old one; the fourth is refused.
    let mut uploaded = Vec::new();
    for n in 0..3 {
        let content = jsonl(4 << 20, &format!("u{n}"));
        let content = &content[..(4 << 20) - old_upload.len()];
        let (status, file) = upload(port, &format!("u{n}.jsonl"), content);
        assert_eq!(status, 200, "{file}");
        assert_eq!(file["bytes"], content.len(), "{file}");
        uploaded.push((file["id"].as_str().unwrap().to_owned(), content.to_vec()));
    }
    let over = jsonl(4 << 20, "over");
    let (status, refusal) = upload(port, "over.jsonl", &over);
    assert_eq!(status, 413, "{refusal}");
    assert_eq!(refusal["error"]["code"], "quota_exceeded", "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_project_file_bytes"), "{message}");
    let leftovers: Vec<String> = std::fs::read_dir(&files)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp") && !live.ends_with(name))
        .collect();
    assert!(leftovers.is_empty(), "a refused upload left {leftovers:?}");

    // Paged newest first, two at a time, every file once.
    let ids = all_file_ids(port, 2);
    let mut expected: Vec<String> = uploaded.iter().rev().map(|(id, _)| id.clone()).collect();
    expected.push("file-old".into());
    assert_eq!(ids, expected);

    // Content comes back whole, with its length.
    let (id, content) = &uploaded[1];
    let (status, response) = get(port, &format!("/v1/files/{id}/content"));
    assert_eq!(status, 200);
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-length: {}", content.len())),
        "{head}"
    );
    assert_eq!(body.as_bytes(), content.as_slice());

    // Deleting one frees its bytes.
    let (status, deleted) = raw_http(
        port,
        format!("DELETE /v1/files/{id} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
    )
    .unwrap();
    assert_eq!(status, 200, "{deleted}");
    let (status, again) = upload(port, "again.jsonl", content);
    assert_eq!(status, 200, "{again}");

    // After a restart the index is read again: the same files, the same quota.
    let before = all_file_ids(port, 100);
    server.signal("TERM");
    let _ = server.child.wait();
    let server = Server::start(&cortex, &args);
    assert_eq!(all_file_ids(server.port, 3), before);
    let (status, refusal) = upload(server.port, "over.jsonl", &over);
    assert_eq!(status, 413, "{refusal}");
}

/// The attempts an item gets, where a job is made: `--max-attempts` on
/// `cortex submit`, and the server's setting (`max_attempts`, here from
/// its environment) for batches of the Batch API, 3 when unset.
#[test]
fn jobs_get_the_attempts_they_were_given_by_the_cli_and_the_batch_api() {
    let cortex = Cortex::new();
    cortex.write("a.jsonl", &String::from_utf8(jsonl(1, "cli")).unwrap());
    cortex.ok(&["submit", "a.jsonl", "--max-attempts", "5"]);
    assert_eq!(cortex.job(1).max_attempts, 5);

    for (attempts, expected) in [(Some("5"), 5), (None, 3)] {
        let mut serving = Cortex::new();
        if let Some(attempts) = attempts {
            serving.set_env("CORTEX_MAX_ATTEMPTS", attempts);
        }
        let server = Server::start(&serving, &["--parallel", "1", "--batch-parallel", "0"]);
        let (status, file) = upload(server.port, "in.jsonl", &jsonl(1, "api"));
        assert_eq!(status, 200, "{file}");
        let request = serde_json::json!({
            "input_file_id": file["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        });
        let (status, text) =
            cortex_tests::http(server.port, "POST", "/v1/batches", &request.to_string())
                .expect("an answer");
        assert_eq!(status, 200, "{text}");
        assert_eq!(serving.job(1).max_attempts, expected, "{attempts:?}");
    }
}
