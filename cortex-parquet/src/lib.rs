//! Parquet in and out of cortex jobs, as the people who keep their prompts
//! in tables (Ray Data, Spark, pandas) have them.
//!
//! In: [`RowLines`] reads a Parquet file (or an object in a store, through
//! `cortex-objects`: 4 MiB blocks fetched as the reader needs them, 16 kept)
//! a batch of rows at a time and
//! yields each row as one input line of cortex's JSONL format, which the
//! wire-format crate then parses as it parses a file's lines (so every
//! check, every error with its row number, every field is the same). A row
//! is a line as it stands (OpenAI batch columns `custom_id`, `method`,
//! `url`, `body` as a struct or a JSON string; or plain columns `prompt`,
//! `messages` as a list of `{role, content}` structs or a JSON string, and
//! any sampling field), or, with a [`TableInput::prompt_template`], a chat
//! whose user message is the template filled from the row's columns
//! (`Summarise: {text}`), its `custom_id` from [`TableInput::id_column`]
//! (else the row number). A template reads text tables the same way
//! ([`RowLines::open_text`]): JSONL rows whose keys are the columns, and CSV
//! with a header row ([`TextTable`] tells them apart by the first line).
//!
//! Out: [`write_results`] turns a job's exported JSONL (results and errors)
//! into one table in input order: `custom_id`, `text` (the first choice),
//! `finish_reason`, `prompt_tokens`, `completion_tokens`, `error`, and
//! `response` (the whole response body as JSON), into any writer (the CLI
//! hands it a file that replaces its name whole once written).
//!
//! ```
//! use std::io::BufRead;
//!
//! // A JSON array of requests read as the JSONL lines a job takes.
//! let array = r#"[{"custom_id": "a", "prompt": "Hi"},
//!                 {"custom_id": "b", "prompt": "Hello"}]"#;
//! let (lines, count) = cortex_parquet::json_array_lines(array.as_bytes())?;
//! assert_eq!(count, 2);
//! let lines: Vec<String> = lines.lines().collect::<Result<_, _>>()?;
//! assert_eq!(lines[1], r#"{"custom_id":"b","prompt":"Hello"}"#);
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Design notes
//!
//! Rows become JSON through Arrow's own JSON writer (`arrow-json`), so any
//! column type Arrow has reads the way Arrow writes it; nothing here knows
//! OpenAI's request fields beyond the two that may come as JSON text
//! (`body`, `messages`). Memory: one batch of rows (1,024) at a time.

#![forbid(unsafe_code)]

mod input;
mod output;
mod remote;

pub use input::{RowLines, TableInput, TextTable, is_parquet, is_parquet_object, json_array_lines};
pub use output::{KeptColumns, ResultTable, write_results};

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::Arc;

    use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    fn table(path: &std::path::Path, columns: Vec<(&str, arrow_array::ArrayRef)>) {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, array)| Field::new(*name, array.data_type().clone(), true))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            columns.into_iter().map(|c| c.1).collect(),
        )
        .unwrap();
        let mut writer =
            ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    fn lines(path: &std::path::Path, input: &TableInput) -> Vec<serde_json::Value> {
        let mut text = String::new();
        RowLines::open(path, input)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn rows_become_lines_as_they_stand_or_through_a_template() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.parquet");
        table(
            &path,
            vec![
                ("id", Arc::new(Int64Array::from(vec![7, 9]))),
                (
                    "text",
                    Arc::new(StringArray::from(vec![Some("cats"), None])),
                ),
            ],
        );
        assert!(is_parquet(&path).unwrap());
        let templated = TableInput {
            prompt_template: Some("Summarise {{briefly}}: {text}".into()),
            id_column: Some("id".into()),
        };
        assert_eq!(
            lines(&path, &templated),
            [
                serde_json::json!({"custom_id": "7", "messages": [{"role": "user", "content": "Summarise {briefly}: cats"}]}),
                serde_json::json!({"custom_id": "9", "messages": [{"role": "user", "content": "Summarise {briefly}: "}]}),
            ]
        );
        let wrong = TableInput {
            prompt_template: Some("{txt}".into()),
            id_column: None,
        };
        let error = RowLines::open(&path, &wrong).err().unwrap().to_string();
        assert!(
            error.contains("\"txt\"") && error.contains("id, text"),
            "{error}"
        );

        let batch = dir.path().join("batch.parquet");
        table(
            &batch,
            vec![
                ("custom_id", Arc::new(StringArray::from(vec!["a"]))),
                (
                    "body",
                    Arc::new(StringArray::from(vec![
                        r#"{"prompt": "Hi", "max_tokens": 3}"#,
                    ])),
                ),
            ],
        );
        assert_eq!(
            lines(&batch, &TableInput::default()),
            [serde_json::json!({"custom_id": "a", "body": {"prompt": "Hi", "max_tokens": 3}})]
        );
        assert!(
            !is_parquet(&dir.path().join("in.parquet").with_extension("none")).is_ok_and(|p| p)
        );
    }

    #[test]
    fn results_and_errors_become_one_table_in_input_order() {
        let dir = tempfile::tempdir().unwrap();
        let (results, errors, out) = (
            dir.path().join("r.jsonl"),
            dir.path().join("e.jsonl"),
            dir.path().join("out.parquet"),
        );
        std::fs::write(&results, concat!(
            r#"{"id": "batch_req_1_1", "custom_id": "a", "response": {"status_code": 200, "body": {"choices": [{"message": {"content": "Hello"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}}, "error": null}"#, "\n",
            r#"{"id": "batch_req_1_3", "custom_id": "c", "response": {"status_code": 200, "body": {"choices": [{"text": "x", "finish_reason": "length"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}}, "error": null}"#, "\n",
        )).unwrap();
        std::fs::write(&errors, concat!(
            r#"{"id": "batch_req_1_2", "custom_id": "b", "response": null, "error": {"code": "batch_expired", "message": "too late", "line": 2}}"#, "\n",
        )).unwrap();
        // The input table: its `text` kept (as input_text) and `n`.
        let input = dir.path().join("in.parquet");
        table(
            &input,
            vec![
                ("text", Arc::new(StringArray::from(vec!["t1", "t2", "t3"]))),
                ("n", Arc::new(Int64Array::from(vec![1, 2, 3]))),
            ],
        );
        let kept = KeptColumns::open(&input, &["text".into(), "n".into()]).unwrap();
        let written = write_results(
            &results,
            &errors,
            std::fs::File::create(&out).unwrap(),
            Some(kept),
        )
        .unwrap();
        assert_eq!(
            written,
            ResultTable {
                results: 2,
                errors: 1
            }
        );
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&out).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let batch = reader.map(Result::unwrap).next().unwrap();
        let text = |name: &str| {
            let column = batch.column_by_name(name).unwrap();
            let strings = column.as_any().downcast_ref::<StringArray>().unwrap();
            (0..strings.len())
                .map(|i| (!strings.is_null(i)).then(|| strings.value(i).to_owned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            text("custom_id"),
            [Some("a".into()), Some("b".into()), Some("c".into())]
        );
        assert_eq!(text("text"), [Some("Hello".into()), None, Some("x".into())]);
        assert_eq!(text("error"), [None, Some("too late".into()), None]);
        assert_eq!(
            text("input_text"),
            [Some("t1".into()), Some("t2".into()), Some("t3".into())]
        );
        let n = batch.column_by_name("n").unwrap();
        let n = n.as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(n.values(), &[1, 2, 3]);
        let missing = KeptColumns::open(&input, &["nope".into()]).err().unwrap();
        assert!(missing.to_string().contains("\"nope\""), "{missing}");
        assert_eq!(
            batch
                .schema()
                .field_with_name("prompt_tokens")
                .unwrap()
                .data_type(),
            &DataType::UInt64
        );
        assert!(
            !dir.path().read_dir().unwrap().any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("partial"))
        );
    }
}
