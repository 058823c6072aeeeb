//! A job's results as a table.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use serde_json::Value;

/// Rows written at a time.
const BATCH_ROWS: usize = 4096;

/// What [`write_results`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultTable {
    /// Rows with a result.
    pub results: u64,
    /// Rows with an error.
    pub errors: u64,
}

fn schema() -> Arc<Schema> {
    let text = |name: &str| Field::new(name, DataType::Utf8, true);
    let count = |name: &str| Field::new(name, DataType::UInt64, true);
    Arc::new(Schema::new(vec![
        Field::new("custom_id", DataType::Utf8, false),
        text("text"),
        text("finish_reason"),
        count("prompt_tokens"),
        count("completion_tokens"),
        text("error"),
        text("response"),
    ]))
}

/// One output or error line, with the input line it answers.
struct Row {
    line: u64,
    custom_id: String,
    text: Option<String>,
    finish_reason: Option<String>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    error: Option<String>,
    response: Option<String>,
}

/// The input line an output line answers: its id is `batch_req_{job}_{line}`.
fn line_of(value: &Value) -> u64 {
    value["error"]["line"].as_u64().unwrap_or_else(|| {
        value["id"]
            .as_str()
            .and_then(|id| id.rsplit('_').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX)
    })
}

fn row_of(value: &Value) -> Row {
    let body = &value["response"]["body"];
    let choice = &body["choices"][0];
    let text = choice["message"]["content"]
        .as_str()
        .or(choice["text"].as_str())
        .or(body["output"][0]["content"][0]["text"].as_str())
        .map(str::to_owned);
    let usage = &body["usage"];
    let error = match &value["error"] {
        Value::Null => None,
        error => Some(
            error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned),
        ),
    };
    Row {
        line: line_of(value),
        custom_id: value["custom_id"].as_str().unwrap_or_default().to_owned(),
        text,
        finish_reason: choice["finish_reason"]
            .as_str()
            .or(body["status"].as_str())
            .map(str::to_owned),
        prompt_tokens: usage["prompt_tokens"]
            .as_u64()
            .or(usage["input_tokens"].as_u64()),
        completion_tokens: usage["completion_tokens"]
            .as_u64()
            .or(usage["output_tokens"].as_u64()),
        error,
        response: (!body.is_null()).then(|| body.to_string()),
    }
}

fn read_rows(path: &Path) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for line in BufReader::new(File::open(path)?).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        rows.push(row_of(&value));
    }
    Ok(rows)
}

/// Writes the table of a job's exported `results` and `errors` (JSONL, as
/// `cortex results` writes them) to `output`, in input order, atomically.
pub fn write_results(results: &Path, errors: &Path, output: &Path) -> io::Result<ResultTable> {
    let mut rows = read_rows(results)?;
    let counted = ResultTable {
        results: rows.len() as u64,
        errors: 0,
    };
    let mut failed = read_rows(errors)?;
    let counted = ResultTable {
        errors: failed.len() as u64,
        ..counted
    };
    rows.append(&mut failed);
    rows.sort_by_key(|r| r.line);

    let name = output
        .file_name()
        .map_or_else(|| "results".into(), |n| n.to_string_lossy().into_owned());
    let partial = output.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    let written = write_table(&rows, &partial).and_then(|()| std::fs::rename(&partial, output));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.map(|()| counted)
}

fn write_table(rows: &[Row], path: &Path) -> io::Result<()> {
    let schema = schema();
    let file = File::create(path)?;
    let mut writer =
        ArrowWriter::try_new(file, Arc::clone(&schema), None).map_err(io::Error::other)?;
    for chunk in rows.chunks(BATCH_ROWS) {
        let mut custom_id = StringBuilder::new();
        let mut text = StringBuilder::new();
        let mut finish_reason = StringBuilder::new();
        let mut prompt_tokens = UInt64Builder::new();
        let mut completion_tokens = UInt64Builder::new();
        let mut error = StringBuilder::new();
        let mut response = StringBuilder::new();
        for row in chunk {
            custom_id.append_value(&row.custom_id);
            text.append_option(row.text.as_deref());
            finish_reason.append_option(row.finish_reason.as_deref());
            prompt_tokens.append_option(row.prompt_tokens);
            completion_tokens.append_option(row.completion_tokens);
            error.append_option(row.error.as_deref());
            response.append_option(row.response.as_deref());
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(custom_id.finish()),
            Arc::new(text.finish()),
            Arc::new(finish_reason.finish()),
            Arc::new(prompt_tokens.finish()),
            Arc::new(completion_tokens.finish()),
            Arc::new(error.finish()),
            Arc::new(response.finish()),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).map_err(io::Error::other)?;
        writer.write(&batch).map_err(io::Error::other)?;
    }
    writer.close().map_err(io::Error::other)?;
    Ok(())
}
