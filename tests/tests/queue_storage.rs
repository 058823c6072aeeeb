//! The database itself: schema migrations from version 1, a newer schema,
//! and a full disk during commits and exports.

use cortex_queue::{JobStore, WorkerStore};
use std::path::Path;
use std::process::Command;

use cortex_openai::{ExportJsonl, SubmitJsonl};
use cortex_queue::{ClaimOptions, JobState, QueueError, SubmitOptions};
use cortex_queue_sqlite::{SCHEMA_VERSION, Store};
use cortex_queue_suite::{response_for, submit_prompts, write_prompts};
use cortex_request::{ChatMessage, Request, RequestId};

/// Builds a database the way version 1 of the schema left it: its migration
/// only, with a job of three items (one completed, one pending, one failed).
fn make_version_1_database(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
    conn.execute_batch(include_str!(
        "../../cortex-queue-sqlite/migrations/0001_jobs_items_results.sql"
    ))
    .unwrap();
    conn.execute_batch(
        "INSERT INTO jobs (id, state, source_name, source_sha256, params_sha256, model, defaults, metadata,
                           max_attempts, lines, created_at, validating_at, in_progress_at)
         VALUES (1, 'in_progress', 'old.jsonl', 'abc', 'def', 'smol', '{}', '{\"team\":\"x\"}', 3, 3, 1000, 1000, 1001);",
    )
    .unwrap();
    let request = |text: &str| {
        serde_json::to_string(&Request::new(RequestId(0), vec![ChatMessage::user(text)])).unwrap()
    };
    for (id, state) in [(1, "completed"), (2, "pending"), (3, "failed")] {
        conn.execute(
            "INSERT INTO items (id, job_id, line, custom_id, endpoint, request, state, attempts, updated_at)
             VALUES (?1, 1, ?1, ?2, '/v1/chat/completions', ?3, ?4, ?5, 1002)",
            rusqlite::params![id, format!("old-{id}"), request(&format!("question {id}")), state, i64::from(state != "pending")],
        )
        .unwrap();
    }
    conn.execute_batch(
        "INSERT INTO results (item_id, job_id, attempt, body, prompt_tokens, completion_tokens, completed_at)
         VALUES (1, 1, 1, '{\"object\":\"chat.completion\",\"choices\":[]}', 5, 2, 1003);
         UPDATE items SET error_code = 'driver', error_message = 'old failure' WHERE id = 3;
         PRAGMA user_version = 1;",
    )
    .unwrap();
}

#[test]
fn a_version_1_database_is_migrated_and_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    make_version_1_database(&path);

    let mut store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let job = store.jobs(&Default::default()).unwrap().remove(0);
    assert_eq!(
        (
            job.source_name.as_str(),
            job.prompt_tokens,
            job.metadata["team"].as_str()
        ),
        ("old.jsonl", 5, "x")
    );
    assert_eq!(
        (job.counts.completed, job.counts.pending, job.counts.failed),
        (1, 1, 1)
    );

    // Claims (which now register workers, new in version 2) and completion work on old rows.
    let claimed = store.claim(10, &ClaimOptions::default()).unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].custom_id, "old-2");
    store
        .complete(&claimed[0].lease, &response_for(&claimed[0]))
        .unwrap();
    assert_eq!(store.job(job.id).unwrap().state, JobState::Completed);
    let out = dir.path().join("out.jsonl");
    assert_eq!(store.export(job.id, &out, None, false).unwrap().results, 2);
    // The old row's body as it was rendered then; the new one rendered now.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[0]["response"]["body"],
        serde_json::json!({"object": "chat.completion", "choices": []})
    );
    assert_eq!(lines[1]["custom_id"], "old-2");
    let body = &lines[1]["response"]["body"];
    assert_eq!(
        (body["object"].as_str(), body["model"].as_str()),
        (Some("chat.completion"), Some("smol"))
    );
    assert_eq!(body["choices"][0]["message"]["content"], "answer to old-2");
    store.integrity_check().unwrap();

    // A second open finds it current and changes nothing.
    drop(store);
    assert_eq!(
        Store::open(&path).unwrap().schema_version().unwrap(),
        SCHEMA_VERSION
    );
}

#[test]
fn a_database_from_a_newer_cortex_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    drop(Store::open(&path).unwrap());
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("PRAGMA user_version = 99")
        .unwrap();
    let error = Store::open(&path).unwrap_err();
    assert!(
        matches!(error, QueueError::NewerSchema { found: 99, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("use a newer cortex"));
}

#[test]
fn a_database_in_a_missing_directory_is_a_clear_error() {
    let error = Store::open("/nonexistent-dir/cortex.db").unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot open the job database /nonexistent-dir/cortex.db: the directory /nonexistent-dir does not exist"
    );
}

/// Fills the database's size limit: the write fails as a full disk, the
/// database stays intact, and work goes on when there is room again.
#[test]
fn a_full_database_fails_the_write_cleanly_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("q.db")).unwrap();
    let small = submit_prompts(&mut store, dir.path(), "small.jsonl", 4);
    let pages: i64 = rusqlite::Connection::open(store.path())
        .unwrap()
        .query_row("PRAGMA page_count", [], |row| row.get(0))
        .unwrap();
    store.set_max_page_count(pages + 2).unwrap();

    let big = write_prompts(dir.path(), "big.jsonl", 5000);
    let error = store
        .submit_file(&big, &SubmitOptions::new("m"))
        .unwrap_err();
    assert!(matches!(error, QueueError::DiskFull { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        format!(
            "the disk holding {} is full: nothing was written; free some space and try again",
            store.path().display()
        )
    );
    store.integrity_check().unwrap();
    assert_eq!(
        store.jobs(&Default::default()).unwrap().len(),
        1,
        "the failed submit left nothing"
    );

    // Work on the existing job continues until a write needs a new page, and fails cleanly then too.
    let mut written = 0;
    let outcome = loop {
        let Some(claimed) = store
            .claim(1, &ClaimOptions::default())
            .map(|mut c| c.pop())
            .transpose()
        else {
            break None;
        };
        match claimed.and_then(|c| store.complete(&c.lease, &response_for(&c))) {
            Ok(()) => written += 1,
            Err(e) => break Some(e),
        }
    };
    if let Some(error) = outcome {
        assert!(matches!(error, QueueError::DiskFull { .. }), "{error}");
    }
    store.integrity_check().unwrap();

    assert_eq!(
        store.job(small).unwrap().counts.completed,
        written,
        "every result written before the disk filled is kept"
    );

    store.set_max_page_count(1 << 30).unwrap();
    let job = store.submit_file(&big, &SubmitOptions::new("m")).unwrap();
    assert_eq!(job.items, 5000);
    let claimed = store.claim(64, &ClaimOptions::default()).unwrap();
    for c in &claimed {
        store.complete(&c.lease, &response_for(c)).unwrap();
    }
    store.integrity_check().unwrap();
}

/// A tmpfs small enough to fill, when this process may mount one (root in CI).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        status.success().then_some(SmallDisk { dir })
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_disk_during_commit_and_export_loses_nothing() {
    let Some(disk) = SmallDisk::mount("1m") else {
        eprintln!(
            "skipped: cannot mount a tmpfs here (not root); the size-limit test covers the database side"
        );
        return;
    };
    let inputs = tempfile::tempdir().unwrap();
    let db = disk.dir.path().join("q.db");
    let mut store = Store::open(&db).unwrap();
    let first = store
        .submit_file(
            &write_prompts(inputs.path(), "a.jsonl", 20),
            &SubmitOptions::new("m"),
        )
        .unwrap()
        .job;
    for c in store.claim(20, &ClaimOptions::default()).unwrap() {
        store.complete(&c.lease, &response_for(&c)).unwrap();
    }

    let output = disk.dir.path().join("out.jsonl");
    std::fs::write(&output, "older export\n").unwrap();

    // A real ENOSPC from the file system while the transaction is written out.
    let big = write_prompts(inputs.path(), "big.jsonl", 20_000);
    let error = store
        .submit_file(&big, &SubmitOptions::new("m"))
        .unwrap_err();
    assert!(matches!(error, QueueError::DiskFull { .. }), "{error}");
    store.integrity_check().unwrap();
    assert_eq!(store.jobs(&Default::default()).unwrap().len(), 1);

    // Export onto the full disk: the error names the file; an older export stays whole.
    let filler = disk.dir.path().join("filler");
    let _ = std::fs::write(&filler, vec![0_u8; 1 << 20]);
    let error = store.export(first, &output, None, false).unwrap_err();
    assert!(
        matches!(&error, QueueError::Io { path, .. } if path == &output),
        "{error}"
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "older export\n");
    let leftovers: Vec<_> = std::fs::read_dir(disk.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Space returns: everything works again.
    std::fs::remove_file(&filler).unwrap();
    disk.resize("64m");
    assert_eq!(
        store
            .submit_file(&big, &SubmitOptions::new("m"))
            .unwrap()
            .items,
        20_000
    );
    assert_eq!(
        store.export(first, &output, None, false).unwrap().results,
        20
    );
    store.integrity_check().unwrap();
    drop(store);
}

#[test]
fn writers_wait_out_a_long_lock_instead_of_failing_with_database_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let mut store = Store::open(&path).unwrap();
    let input = write_prompts(dir.path(), "p.jsonl", 3);

    // Another process holds the write lock for 4 busy timeouts.
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder
        .execute_batch("BEGIN IMMEDIATE; UPDATE jobs SET priority = 0;")
        .unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(store_busy_timeout() * 4);
        holder.execute_batch("COMMIT").unwrap();
    });
    let job = store
        .submit_file(&input, &SubmitOptions::new("m"))
        .unwrap()
        .job;
    assert_eq!(store.claim(3, &ClaimOptions::default()).unwrap().len(), 3);
    release.join().unwrap();
    assert_eq!(store.job(job).unwrap().counts.running, 3);
}

fn store_busy_timeout() -> std::time::Duration {
    cortex_queue_sqlite::StoreConfig::default().busy_timeout
}
