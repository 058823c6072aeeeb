//! Parquet tables in and out of the real binary, written and read by
//! `pyarrow`: a plain dataset through a prompt template, OpenAI batch
//! columns, the same answers as the same lines in JSONL, and the mistakes.

use std::path::Path;

use cortex_tests::{Cortex, python_check, read_jsonl, table_rows_as_jsonl};

/// The rows of a Parquet file as pyarrow reads them (after its schema).
fn table(path: &Path) -> (serde_json::Value, Vec<serde_json::Value>) {
    let printed = python_check("parquet_tables.py", &[Path::new("read"), path]);
    let mut lines = printed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    let schema = lines.next().unwrap()["schema"].clone();
    (schema, lines.collect())
}

#[test]
fn a_table_runs_through_a_prompt_template_to_a_table_with_the_jsonl_answers() {
    let cortex = Cortex::new();
    let input = cortex.dir().join("in.parquet");
    python_check(
        "parquet_tables.py",
        &[Path::new("plain"), &input, Path::new("12")],
    );
    let said = cortex.ok(&[
        "run",
        "in.parquet",
        "--prompt-template",
        "Write one sentence about {text}.",
        "--id-column",
        "id",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "-o",
        "out.parquet",
    ]);
    assert!(said.contains("12 of 12 requests completed"), "{said}");
    let (schema, rows) = table(&cortex.dir().join("out.parquet"));
    assert_eq!(schema["custom_id"], "string");
    assert_eq!(schema["completion_tokens"], "uint64");
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["custom_id"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (100..112).map(|i| i.to_string()).collect();
    assert_eq!(ids, expected, "every row once, in input order");
    for row in &rows {
        assert!(row["error"].is_null() && row["text"].is_string(), "{row}");
        let response: serde_json::Value =
            serde_json::from_str(row["response"].as_str().unwrap()).unwrap();
        assert_eq!(response["object"], "chat.completion");
    }

    // The same requests as JSONL lines give the same answers.
    let lines = table_rows_as_jsonl(12);
    cortex.write("same.jsonl", &lines);
    cortex.ok(&[
        "run",
        "same.jsonl",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ]);
    let jsonl = read_jsonl(&cortex.dir().join("same.results.jsonl"));
    for (row, line) in rows.iter().zip(&jsonl) {
        assert_eq!(
            row["text"], line["response"]["body"]["choices"][0]["message"]["content"],
            "{row} {line}"
        );
    }
}

#[test]
fn batch_columns_submit_as_batch_lines_and_results_export_as_a_table() {
    let cortex = Cortex::new();
    let input = cortex.dir().join("batch.parquet");
    python_check(
        "parquet_tables.py",
        &[Path::new("batch"), &input, Path::new("5")],
    );
    assert_eq!(cortex.ok(&["submit", "batch.parquet"]).trim(), "1");
    cortex.ok(&["worker"]);
    cortex.ok(&["results", "1", "-o", "b.parquet"]);
    let (_, rows) = table(&cortex.dir().join("b.parquet"));
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["row-0", "row-1", "row-2", "row-3", "row-4"]);
    assert!(
        rows.iter()
            .all(|r| r["finish_reason"].is_string() && r["completion_tokens"].as_u64() > Some(0))
    );
    // No staging file is left beside it.
    let left: Vec<String> = std::fs::read_dir(cortex.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("b.parquet") && n != "b.parquet")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_template_naming_a_missing_column_is_refused_in_any_table() {
    let cortex = Cortex::new();
    let input = cortex.dir().join("in.parquet");
    python_check(
        "parquet_tables.py",
        &[Path::new("plain"), &input, Path::new("3")],
    );
    cortex.refused(
        &["submit", "in.parquet", "--prompt-template", "About {txt}"],
        &["\"txt\"", "its columns: id, text"],
    );
    // A JSONL file is a table too under a template: its first row's keys
    // are the columns.
    cortex.write("p.jsonl", "{\"prompt\": \"Hi\"}\n");
    cortex.refused(
        &["submit", "p.jsonl", "--prompt-template", "About {text}"],
        &[
            "p.jsonl: the prompt template names the column \"text\"",
            "its columns: prompt",
        ],
    );
}
