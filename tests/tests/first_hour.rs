//! A newcomer's first hour, as they meet it through the binary: no output
//! ever replaces an input, outputs are checked before anything is
//! generated, default names never collide, a JSON array is read as the
//! lines it lists, and each documented exit path. Each test takes the model
//! in turn.

use std::sync::Mutex;

use cortex_tests::{Cortex, prompts, read_jsonl};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn no_output_replaces_a_file_the_job_reads_by_any_name() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.ok(&["list"]);
    let input = prompts(3, 2);
    cortex.write("self.jsonl", &input);
    std::fs::hard_link(
        cortex.dir().join("self.jsonl"),
        cortex.dir().join("hard.jsonl"),
    )
    .unwrap();
    std::os::unix::fs::symlink("self.jsonl", cortex.dir().join("link.jsonl")).unwrap();
    let db = cortex.db().display().to_string();
    let model = cortex.ok(&["models", "info", "--json"]);
    let model: serde_json::Value = serde_json::from_str(&model).unwrap();
    let model = model["path"].as_str().unwrap().to_owned();
    let refusals: [(&[&str], &str); 6] = [
        (
            &["run", "self.jsonl", "-o", "self.jsonl"],
            "it is the input",
        ),
        (
            &["run", "self.jsonl", "-o", "hard.jsonl"],
            "it is the input",
        ),
        (
            &["run", "self.jsonl", "-o", "link.jsonl"],
            "it is the input",
        ),
        // The error file a -o implies, and one named.
        (
            &["run", "self.errors.jsonl", "-o", "self.jsonl"],
            "it is the input",
        ),
        (
            &["run", "self.jsonl", "-o", &db],
            "it is the queue's database",
        ),
        (&["run", "self.jsonl", "-o", &model], "it is the model"),
    ];
    // (`self.errors.jsonl` must exist to be read: it is the input there.)
    cortex.write("self.errors.jsonl", &input);
    for (args, why) in refusals {
        let (code, stderr) = cortex.exit_and_stderr(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: refusing to write the") && stderr.contains(why),
            "{args:?}: {stderr}"
        );
    }
    let (code, stderr) = cortex.exit_and_stderr(&["run", "self.jsonl", "--errors", "hard.jsonl"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("the error file to hard.jsonl"), "{stderr}");
    // Nothing was submitted, and every input is as it was.
    assert!(cortex.store().jobs(&Default::default()).unwrap().is_empty());
    for name in ["self.jsonl", "self.errors.jsonl"] {
        assert_eq!(
            std::fs::read_to_string(cortex.dir().join(name)).unwrap(),
            input
        );
    }
    // `cortex results` keeps the job's own input too.
    cortex.ok(&["run", "self.jsonl", "-o", "out.jsonl"]);
    let (code, stderr) = cortex.exit_and_stderr(&["results", "1", "-o", "self.jsonl"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("it is the job's input"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(cortex.dir().join("self.jsonl")).unwrap(),
        input
    );
}

#[test]
fn a_bad_output_is_found_before_generating_and_a_failed_write_says_how_to_recover() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.ok(&["list"]);
    cortex.write("p.jsonl", &prompts(2, 2));
    let (code, stderr) = cortex.exit_and_stderr(&["run", "p.jsonl", "-o", "nodir/x.jsonl"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("no file can be created in nodir") && !stderr.contains("submitted"),
        "{stderr}"
    );
    assert!(cortex.store().jobs(&Default::default()).unwrap().is_empty());
    let (code, stderr) = cortex.exit_and_stderr(&["run", "p.jsonl", "--errors", "nodir/e.jsonl"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("nodir"), "{stderr}");
    assert!(cortex.store().jobs(&Default::default()).unwrap().is_empty());
}

#[test]
fn default_output_names_carry_the_inputs_whole_name() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("bom.jsonl", "{\"prompt\": \"Hi\", \"max_tokens\": 2}\n");
    cortex.write("bom.csv", "id,text\na,Tea\n");
    cortex.ok(&["run", "bom.jsonl"]);
    cortex.ok(&[
        "run",
        "bom.csv",
        "--prompt-template",
        "One word for: {text}",
        "--max-tokens",
        "2",
    ]);
    let jsonl = read_jsonl(&cortex.dir().join("bom.results.jsonl"));
    let csv = read_jsonl(&cortex.dir().join("bom.csv.results.jsonl"));
    assert_eq!((jsonl.len(), csv.len()), (1, 1));
    assert_eq!(jsonl[0]["custom_id"], "1");
    assert_eq!(csv[0]["custom_id"], "1");
    assert_ne!(jsonl[0]["id"], csv[0]["id"], "two jobs' results, both kept");
    assert!(cortex.dir().join("bom.csv.errors.jsonl").is_file());
    // `cortex results` follows the same rule: job-N.results.jsonl and its
    // error file beside it; for stdout, job-N.errors.jsonl here.
    cortex.ok(&["results", "2"]);
    assert!(cortex.dir().join("job-2.results.jsonl").is_file());
    assert!(cortex.dir().join("job-2.errors.jsonl").is_file());
    std::fs::create_dir(cortex.dir().join("sub")).unwrap();
    cortex.ok(&["results", "1", "-o", "sub/partial.jsonl"]);
    assert!(cortex.dir().join("sub/partial.errors.jsonl").is_file());
    assert!(!cortex.dir().join("job-1.errors.jsonl").exists());
}

#[test]
fn a_file_run_again_under_another_chat_template_is_a_new_job_not_the_old_results() {
    let _turn = turn();
    let cortex = Cortex::new();
    let chat = r#"{"custom_id": "c", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "logprobs": true}"#;
    cortex.write("chat.jsonl", &format!("{chat}\n"));
    let ran = |args: &[&str]| {
        let output = cortex.run(args);
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    ran(&[
        "run",
        "chat.jsonl",
        "--chat-template",
        "chatml",
        "-o",
        "plain.jsonl",
    ]);
    // The model's own template renders another prompt: another job.
    let own = ran(&["run", "chat.jsonl", "-o", "own.jsonl"]);
    assert!(!own.contains("submitted before"), "{own}");
    let prompt_tokens = |name: &str| {
        read_jsonl(&cortex.dir().join(name))[0]["response"]["body"]["usage"]["prompt_tokens"]
            .clone()
    };
    assert_ne!(prompt_tokens("plain.jsonl"), prompt_tokens("own.jsonl"));
    // The same file under the same template is the same job, continued.
    let again = ran(&[
        "run",
        "chat.jsonl",
        "--chat-template",
        "chatml",
        "-o",
        "again.jsonl",
    ]);
    assert!(again.contains("submitted before as job 1"), "{again}");
}

#[test]
fn keep_columns_carries_a_csv_or_jsonl_tables_columns_as_the_book_shows() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write(
        "articles.csv",
        "id,source,text\na1,wire,\"Tea, hot\"\n\na2,blog,Bread\n",
    );
    cortex.write(
        "articles.jsonl",
        "{\"id\": \"b1\", \"source\": 7, \"text\": \"Tea\"}\n{\"id\": \"b2\", \"text\": \"Bread\"}\n",
    );
    let expected = [
        ("articles.csv", [("a1", "wire"), ("a2", "blog")]),
        ("articles.jsonl", [("b1", "7"), ("b2", "")]),
    ];
    for (input, rows) in expected {
        let output = format!("{input}.parquet");
        cortex.ok(&[
            "run",
            input,
            "--prompt-template",
            "One word for: {text}",
            "--id-column",
            "id",
            "--keep-columns",
            "id,source",
            "--max-tokens",
            "2",
            "-o",
            &output,
        ]);
        let table = cortex_tests::parquet_rows(&cortex.dir().join(&output));
        let kept: Vec<(String, String)> = table
            .iter()
            .map(|row| {
                assert_eq!(row["custom_id"], row["id"], "{row}");
                let source = row["source"].as_str().unwrap_or_default().to_owned();
                (row["id"].as_str().unwrap().to_owned(), source)
            })
            .collect();
        let rows: Vec<(String, String)> = rows
            .iter()
            .map(|(id, source)| ((*id).to_owned(), (*source).to_owned()))
            .collect();
        assert_eq!(kept, rows, "{input}: {table:?}");
    }
    // A column the table does not have, before anything is generated.
    let (code, stderr) = cortex.exit_and_stderr(&[
        "run",
        "articles.csv",
        "--prompt-template",
        "{text}",
        "--keep-columns",
        "author",
        "-o",
        "x.parquet",
    ]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains(
            "\"author\", which the input table does not have (its columns: id, source, text)"
        ),
        "{stderr}"
    );
}

#[test]
fn a_json_array_of_requests_is_read_as_its_lines_and_a_broken_one_is_named() {
    let _turn = turn();
    let cortex = Cortex::new();
    // What Python's json.dump of a list writes, on one line and pretty.
    cortex.write(
        "list.json",
        "[{\"custom_id\": \"a\", \"prompt\": \"Hi\", \"max_tokens\": 2}, {\"custom_id\": \"b\", \"prompt\": \"Yo\", \"max_tokens\": 2}]",
    );
    cortex.write(
        "pretty.json",
        "[\n  {\n    \"prompt\": \"Hi\",\n    \"max_tokens\": 2\n  },\n  {\n    \"prompt\": \"Yo\",\n    \"max_tokens\": 2\n  }\n]\n",
    );
    let (code, stderr) = cortex.exit_and_stderr(&["run", "list.json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("list.json is a JSON array: its 2 elements are read as lines 1-2"),
        "{stderr}"
    );
    let ids: Vec<_> = read_jsonl(&cortex.dir().join("list.json.results.jsonl"))
        .iter()
        .map(|line| line["custom_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    cortex.ok(&["run", "pretty.json"]);
    assert_eq!(
        read_jsonl(&cortex.dir().join("pretty.json.results.jsonl")).len(),
        2
    );
    // A bad element is named by its place; a broken array says it is one.
    cortex.write("bad.json", "[{\"prompt\": \"ok\"}, {\"prompt\": \"\"}]");
    let (code, stderr) = cortex.exit_and_stderr(&["submit", "bad.json"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("line 2: prompt is empty"), "{stderr}");
    cortex.write("broken.json", "[\n  {\"prompt\": \"a\"},\n]\n");
    let (code, stderr) = cortex.exit_and_stderr(&["submit", "broken.json"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("starts as a JSON array but is not one") && stderr.contains("line 3"),
        "{stderr}"
    );
}

#[test]
fn status_with_no_jobs_exits_as_no_such_job() {
    let cortex = Cortex::new();
    let (code, stderr) = cortex.exit_and_stderr(&["status"]);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("no jobs yet"), "{stderr}");
}

#[test]
fn max_tokens_past_any_context_is_refused_by_name_and_the_context_bounds_a_request() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write(
        "huge.jsonl",
        "{\"custom_id\": \"huge\", \"prompt\": \"Hi\", \"max_tokens\": 1000000000}\n{\"custom_id\": \"fine\", \"prompt\": \"Hi\", \"max_tokens\": 2}\n",
    );
    let (code, stderr) = cortex.exit_and_stderr(&["run", "huge.jsonl"]);
    assert_eq!(code, Some(6), "{stderr}");
    let errors = read_jsonl(&cortex.dir().join("huge.errors.jsonl"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let message = errors[0]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("max_tokens")
            && message.contains("1000000000 is more than this model's context of 8192 tokens"),
        "{message}"
    );
    // --context counts prompt and generation together, exactly.
    cortex.write(
        "long.jsonl",
        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 500, \"ignore_eos\": true}\n",
    );
    cortex.ok(&["run", "long.jsonl", "--context", "64"]);
    let results = read_jsonl(&cortex.dir().join("long.results.jsonl"));
    let usage = &results[0]["response"]["body"]["usage"];
    assert_eq!(usage["total_tokens"], 64, "{usage}");
    assert_eq!(
        results[0]["response"]["body"]["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn a_served_request_with_max_tokens_past_the_context_is_a_400_naming_it() {
    let cortex = Cortex::new();
    let server = cortex_tests::Server::start(&cortex, &["--parallel", "2"]);
    let (status, text) = cortex_tests::http(
        server.port,
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 1000000000}"#,
    )
    .expect("an answer");
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("max_tokens") && text.contains("more than this model's context"),
        "{text}"
    );
}

#[test]
fn the_answer_preview_shows_responses_and_tool_calls() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write(
        "kinds.jsonl",
        concat!(
            r#"{"custom_id": "resp", "method": "POST", "url": "/v1/responses", "body": {"input": "Say hello.", "max_output_tokens": 8, "temperature": 0}}"#,
            "\n",
            r#"{"custom_id": "call", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}], "tool_choice": "required", "max_tokens": 48, "temperature": 0}"#,
            "\n",
        ),
    );
    let output = cortex.run(&["run", "kinds.jsonl"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    let preview = |id: &str| {
        stdout
            .lines()
            .find(|line| line.trim_start().starts_with(id))
            .unwrap_or_else(|| panic!("no preview of {id}: {stdout}"))
            .trim_start()
            .trim_start_matches(id)
            .trim()
            .to_owned()
    };
    assert!(!preview("resp").is_empty(), "{stdout}");
    assert!(preview("call").starts_with("get_weather("), "{stdout}");
}

#[test]
fn llama_cpps_own_warnings_do_not_reach_the_user() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.ok(&["models", "pull", "gemma3-270m"]);
    let output = cortex.run(&[
        "--model",
        "gemma3-270m",
        "generate",
        "Hi",
        "--max-tokens",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        !stderr.contains("control-looking token") && !stderr.contains(" WARN "),
        "{stderr}"
    );
}

#[test]
fn status_right_after_a_detached_worker_says_it_is_starting() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(2, 2));
    let job = cortex.ok(&["submit", "p.jsonl"]).trim().to_owned();
    cortex.ok(&["worker", "--detach"]);
    let mut watch = cortex.spawn(&["status", &job, "--watch"]);
    let watched = loop {
        if let Some(status) = watch.try_wait().unwrap() {
            let output = watch.wait_with_output().unwrap();
            assert!(status.success(), "{output:?}");
            break String::from_utf8_lossy(&output.stderr).into_owned();
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        !watched.contains("no worker is running"),
        "a worker was starting: {watched}"
    );
    assert_eq!(
        cortex.job(job.parse().unwrap()).state,
        cortex_queue::JobState::Completed
    );
}
