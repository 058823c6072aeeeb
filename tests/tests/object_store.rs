//! Jobs from and to an S3-compatible object store (s3s-fs on loopback; and
//! an Azure container on Azurite, Microsoft's emulator),
//! with `pyarrow` writing the input table and reading the output and
//! `boto3` putting and listing objects: a table of 2,000 rows read from the
//! store and written back as Parquet and as JSONL with the answers of the
//! same rows run locally; a kill during the upload that leaves no object and
//! a run again that writes it; input columns kept beside the answers; a
//! job that carries its destination written by the next worker after the
//! one that ended it was killed; a plain web URL (the server without
//! credentials) read in ranges; an object replaced while it is read; the
//! mistakes (a missing object, a wrong secret, an unreachable store, a read-
//! only scheme, a column of the wrong type), each said with the object's URL.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use cortex_tests::{
    AzuriteServer, Cortex, S3Server, TABLE_TEMPLATE, TABLE_TOPICS, parquet_rows, python_check,
    read_jsonl, table_rows_as_jsonl,
};

/// Each output line's custom_id and first choice's text.
fn answers(lines: &[serde_json::Value]) -> BTreeMap<String, String> {
    lines
        .iter()
        .map(|line| {
            let choice = &line["response"]["body"]["choices"][0];
            (
                line["custom_id"].as_str().unwrap().to_owned(),
                choice["message"]["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_table_in_the_store_runs_to_parquet_and_jsonl_in_the_store_with_the_local_answers() {
    let Some(s3) = S3Server::start() else { return };
    let mut cortex = Cortex::new();
    s3.configure(&mut cortex);
    let rows = 2000;
    let local_table = cortex.dir().join("rows.parquet");
    python_check(
        "parquet_tables.py",
        &[
            Path::new("plain"),
            &local_table,
            Path::new(&rows.to_string()),
        ],
    );
    s3.boto3(&[
        "put",
        "data",
        "in/rows.parquet",
        local_table.to_str().unwrap(),
    ]);
    let flags = ["--max-tokens", "6", "--temperature", "0"];
    let mut args = vec![
        "run",
        "s3://data/in/rows.parquet",
        "--prompt-template",
        TABLE_TEMPLATE,
        "--id-column",
        "id",
        "-o",
        "s3://data/out/rows.parquet",
        "--keep-columns",
        "text",
    ];
    args.extend(flags);
    let said = cortex.ok(&args);
    assert!(said.contains("2000 of 2000 requests completed"), "{said}");
    assert!(
        said.contains("results: s3://data/out/rows.parquet"),
        "{said}"
    );
    // The same job's results again, as JSONL.
    let said = cortex.ok(&["results", "1", "-o", "s3://data/out/rows.jsonl"]);
    assert!(
        said.contains("2000 results -> s3://data/out/rows.jsonl"),
        "{said}"
    );
    let keys: Vec<String> = s3.list().into_iter().map(|(key, _)| key).collect();
    for key in [
        "in/rows.parquet",
        "out/rows.parquet",
        "out/rows.errors.jsonl",
        "out/rows.jsonl",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key} not in {keys:?}");
    }
    let fetched_table = cortex.dir().join("fetched.parquet");
    let fetched_jsonl = cortex.dir().join("fetched.jsonl");
    s3.boto3(&[
        "get",
        "data",
        "out/rows.parquet",
        fetched_table.to_str().unwrap(),
    ]);
    s3.boto3(&[
        "get",
        "data",
        "out/rows.jsonl",
        fetched_jsonl.to_str().unwrap(),
    ]);
    let table_rows = parquet_rows(&fetched_table);
    assert_eq!(table_rows.len(), rows);
    let from_table: BTreeMap<String, String> = table_rows
        .iter()
        .map(|r| {
            assert!(r["error"].is_null(), "{r}");
            // The input's `text`, kept beside the answer's (renamed: the
            // output has a `text` of its own).
            let id: usize = r["custom_id"].as_str().unwrap().parse().unwrap();
            assert_eq!(r["input_text"], TABLE_TOPICS[(id - 100) % 8], "{r}");
            (
                r["custom_id"].as_str().unwrap().to_owned(),
                r["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let from_jsonl = answers(&read_jsonl(&fetched_jsonl));
    assert_eq!(
        from_table, from_jsonl,
        "the table and the JSONL say the same"
    );

    // The same rows as local JSONL lines, in a fresh installation.
    let local = Cortex::new();
    let lines = table_rows_as_jsonl(rows);
    local.write("rows.jsonl", &lines);
    let mut args = vec!["run", "rows.jsonl", "-o", "local.jsonl"];
    args.extend(flags);
    local.ok(&args);
    let from_local = answers(&read_jsonl(&local.dir().join("local.jsonl")));
    assert_eq!(
        from_table, from_local,
        "the store's job answers as the local one"
    );
}

#[test]
fn a_kill_during_the_upload_leaves_no_object_and_running_again_writes_it() {
    let Some(s3) = S3Server::start() else { return };
    let mut cortex = Cortex::new();
    s3.configure(&mut cortex);
    let input = cortex.write("in.jsonl", &cortex_tests::prompts(24, 6));
    s3.boto3(&["put", "data", "in.jsonl", input.to_str().unwrap()]);
    let args = ["run", "s3://data/in.jsonl", "-o", "s3://data/out/in.jsonl"];
    cortex.killed_at(&args, "upload");
    let keys: Vec<String> = s3.list().into_iter().map(|(key, _)| key).collect();
    assert!(
        !keys.iter().any(|k| k == "out/in.jsonl"),
        "no half object: {keys:?}"
    );

    let said = cortex.ok(&args);
    assert!(said.contains("24 of 24 requests completed"), "{said}");
    let fetched = cortex.dir().join("fetched.jsonl");
    s3.boto3(&["get", "data", "out/in.jsonl", fetched.to_str().unwrap()]);
    assert_eq!(read_jsonl(&fetched).len(), 24);
    // Nothing finished was generated again.
    for item in cortex.items(1) {
        assert_eq!(item.attempts, 1, "{}", item.custom_id);
    }
}

#[test]
fn an_object_replaced_while_it_is_read_is_refused_and_nothing_is_kept() {
    let Some(s3) = S3Server::start() else { return };
    let mut cortex = Cortex::new();
    s3.configure(&mut cortex);
    // 48 MiB of lines: six ranges, read over seconds.
    let line = format!(
        "{}\n",
        serde_json::json!({"prompt": format!("{:0>180}", 1), "max_tokens": 1})
    );
    let count = (48 << 20) / line.len();
    let first = cortex.write("first.jsonl", &line.repeat(count));
    let second = cortex.write("second.jsonl", &line.replace("0001", "0002").repeat(count));
    s3.boto3(&["put", "data", "big.jsonl", first.to_str().unwrap()]);
    let mut submit = cortex.command(&["submit", "s3://data/big.jsonl"]);
    submit.stdout(std::process::Stdio::piped());
    submit.stderr(std::process::Stdio::piped());
    let child = submit.spawn().unwrap();
    // Replaced again and again until the submit ends.
    let done = AtomicBool::new(false);
    let output = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut versions = [&second, &first].into_iter().cycle();
            while !done.load(Ordering::SeqCst) {
                let path = versions.next().unwrap();
                s3.boto3(&["put", "data", "big.jsonl", path.to_str().unwrap()]);
            }
        });
        let output = child.wait_with_output().unwrap();
        done.store(true, Ordering::SeqCst);
        output
    });
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("s3://data/big.jsonl changed while it was being read"),
        "{stderr}"
    );
    let listed = cortex.ok(&["list", "--json"]);
    assert_eq!(listed.trim(), "[]", "nothing was accepted");
}

#[test]
fn mistakes_are_said_with_the_objects_url() {
    let Some(s3) = S3Server::start() else { return };
    let mut cortex = Cortex::new();
    s3.configure(&mut cortex);
    let input = cortex.write("in.jsonl", &cortex_tests::prompts(2, 4));
    s3.boto3(&["put", "data", "in.jsonl", input.to_str().unwrap()]);
    cortex.refused(
        &["submit", "s3://data/missing.jsonl"],
        &["s3://data/missing.jsonl: no such object"],
    );
    cortex.refused(&["submit", "s3://data"], &["s3://data: names no object"]);
    cortex.refused(&["submit", "ftp://host/in.jsonl"], &["not ftp://"]);
    let mut wrong = Cortex::new();
    s3.configure(&mut wrong);
    wrong.set_env("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    wrong.refused(
        &["submit", "s3://data/in.jsonl"],
        &[
            "s3://data/in.jsonl: the store refused access",
            "AWS_SECRET_ACCESS_KEY",
        ],
    );
    let mut keyless = Cortex::new();
    keyless.set_env("AWS_ENDPOINT_URL", &s3.endpoint());
    keyless.set_env("AWS_REGION", "us-east-1");
    keyless.refused(
        &["submit", "s3://data/in.jsonl"],
        &["s3://data/in.jsonl: no credentials: set AWS_ACCESS_KEY_ID"],
    );
    let mut away = Cortex::new();
    s3.configure(&mut away);
    away.set_env(
        "AWS_ENDPOINT_URL",
        &format!("http://127.0.0.1:{}", cortex_tests::free_port()),
    );
    away.refused(
        &["submit", "s3://data/in.jsonl"],
        &["s3://data/in.jsonl:", "Connection refused"],
    );

    // A table whose `messages` column holds numbers: the row is named.
    let bad = cortex.dir().join("bad.parquet");
    python_check("parquet_tables.py", &[Path::new("wrong-type"), &bad]);
    s3.boto3(&["put", "data", "bad.parquet", bad.to_str().unwrap()]);
    cortex.refused(
        &["submit", "s3://data/bad.parquet"],
        &["line 1", "messages"],
    );

    // Results can go to a store that takes writes only.
    cortex.ok(&["run", "s3://data/in.jsonl", "-o", "out.jsonl"]);
    cortex.refused(
        &["results", "1", "-o", "https://127.0.0.1/out.jsonl"],
        &["https:// can only be read"],
    );
    let listed = cortex.ok(&["list", "--json"]);
    let jobs: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(
        jobs.as_array().unwrap().len(),
        1,
        "only the good job: {listed}"
    );
}

#[test]
fn a_job_carrying_its_destination_is_written_there_when_it_ends_even_after_a_kill() {
    let Some(s3) = S3Server::start() else { return };
    let mut cortex = Cortex::new();
    s3.configure(&mut cortex);
    let input = cortex.write("one.jsonl", &cortex_tests::prompts(1, 4));
    s3.boto3(&["put", "data", "in/one.jsonl", input.to_str().unwrap()]);
    cortex.ok(&[
        "submit",
        "s3://data/in/one.jsonl",
        "--output",
        "s3://data/out/one.parquet",
    ]);
    let status = cortex.ok(&["status", "1"]);
    assert!(
        status.contains("output    s3://data/out/one.parquet (written when the job ends)"),
        "{status}"
    );
    // The job's only result commits, ending the job, and the worker dies
    // before it could write the output.
    cortex.killed_at(&["worker"], "complete:committed@1");
    assert_eq!(cortex.job(1).state, cortex_queue::JobState::Completed);
    assert!(!s3.list().iter().any(|(key, _)| key.starts_with("out/")));

    // The next worker, with nothing left to generate, writes it.
    cortex.ok(&["worker"]);
    let keys: Vec<String> = s3.list().into_iter().map(|(key, _)| key).collect();
    for key in ["out/one.parquet", "out/one.errors.jsonl"] {
        assert!(keys.iter().any(|k| k == key), "{key} not in {keys:?}");
    }
    let fetched = cortex.dir().join("one.parquet");
    s3.boto3(&["get", "data", "out/one.parquet", fetched.to_str().unwrap()]);
    let rows = parquet_rows(&fetched);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["custom_id"], "item-0000");
    assert!(rows[0]["text"].is_string(), "{}", rows[0]);

    // A local destination is made absolute at submit: the worker writes it
    // wherever it runs from.
    cortex.write("two.jsonl", &cortex_tests::prompts(2, 4));
    cortex.ok(&["submit", "two.jsonl", "--output", "done/two.jsonl"]);
    std::fs::create_dir(cortex.dir().join("done")).unwrap();
    let mut worker = cortex.command(&["worker"]);
    worker.current_dir(cortex.dir().join("done"));
    assert!(worker.output().unwrap().status.success());
    assert_eq!(read_jsonl(&cortex.dir().join("done/two.jsonl")).len(), 2);
    // https:// cannot take it.
    cortex.refused(
        &[
            "submit",
            "two.jsonl",
            "--force",
            "--output",
            "https://127.0.0.1/x.jsonl",
        ],
        &["https:// can only be read"],
    );
}

#[test]
fn a_web_url_is_read_in_ranges_and_bad_lines_name_it() {
    let Some(web) = S3Server::start_anonymous() else {
        return;
    };
    let cortex = Cortex::new();
    let folder = web.root().join("data");
    std::fs::write(folder.join("in.jsonl"), cortex_tests::prompts(3, 4)).unwrap();
    std::fs::write(
        folder.join("bad.jsonl"),
        "{\"prompt\": \"Hi\"}\n{\"prompt\": 5}\n",
    )
    .unwrap();
    let url = format!("{}/data/in.jsonl", web.endpoint());
    let said = cortex.ok(&["run", &url, "--max-tokens", "4"]);
    assert!(said.contains("3 of 3 requests completed"), "{said}");
    assert!(said.contains("results: in.results.jsonl"), "{said}");
    let bad = format!("{}/data/bad.jsonl", web.endpoint());
    cortex.refused(&["submit", &bad], &[&bad, "line 2: prompt must be"]);
    cortex.refused(
        &["submit", &format!("{}/data/gone.jsonl", web.endpoint())],
        &["/data/gone.jsonl: no such object"],
    );
}

#[test]
fn an_azure_container_is_read_and_written_as_a_bucket_is() {
    let Some(azure) = AzuriteServer::start() else {
        return;
    };
    let mut cortex = Cortex::new();
    azure.configure(&mut cortex);
    let input = cortex.write("in.jsonl", &cortex_tests::prompts(6, 4));
    azure.blobs(&["mkcontainer", "data"]);
    azure.blobs(&["put", "data", "in/in.jsonl", input.to_str().unwrap()]);
    let said = cortex.ok(&[
        "run",
        "az://data/in/in.jsonl",
        "-o",
        "az://data/out/in.parquet",
    ]);
    assert!(said.contains("6 of 6 requests completed"), "{said}");
    let names: Vec<String> = azure
        .blobs(&["list", "data"])
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for name in ["out/in.parquet", "out/in.errors.jsonl"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    let fetched = cortex.dir().join("fetched.parquet");
    azure.blobs(&["get", "data", "out/in.parquet", fetched.to_str().unwrap()]);
    let rows = parquet_rows(&fetched);
    assert_eq!(rows.len(), 6);
    assert!(
        rows.iter()
            .all(|r| r["error"].is_null() && r["text"].is_string())
    );
    cortex.refused(
        &["submit", "az://data/in/missing.jsonl"],
        &["az://data/in/missing.jsonl: no such object"],
    );
}
