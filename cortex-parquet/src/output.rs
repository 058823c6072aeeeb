//! A job's results as a table.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use cortex_objects::RemoteObject;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::file::reader::ChunkReader;
use serde_json::Value;

use crate::input::TextRows;
use crate::remote::ObjectChunks;

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

/// The output's own columns.
const OWN_COLUMNS: [&str; 7] = [
    "custom_id",
    "text",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "error",
    "response",
];

/// Input columns carried into the output table beside each row's result
/// (`--keep-columns`), read from the input table a batch at a time.
pub struct KeptColumns {
    source: KeptSource,
    fields: Vec<Field>,
}

/// Where kept columns are read from.
enum KeptSource {
    Parquet {
        reader: ParquetRecordBatchReader,
        /// Rows read but not yet written.
        pending: Option<RecordBatch>,
    },
    /// A text table's rows (CSV, JSONL rows, a JSON array), the kept
    /// columns as text: a string as it is, anything else as JSON, a missing
    /// value as null.
    Text { rows: TextRows, names: Vec<String> },
}

impl KeptColumns {
    /// `names` of the Parquet file at `path`.
    pub fn open(path: &Path, names: &[String]) -> io::Result<Self> {
        Self::read(File::open(path)?, names)
    }

    /// `names` of a Parquet object in a store.
    pub fn open_object(object: &RemoteObject, names: &[String]) -> io::Result<Self> {
        Self::read(ObjectChunks::new(object.clone()), names)
    }

    /// `names` of a text table (CSV with a header row, JSONL rows, or a
    /// JSON array of rows, told apart by its first line), each row the
    /// input line of one request (as a template makes them).
    pub fn open_text(mut reader: Box<dyn BufRead>, names: &[String]) -> io::Result<Self> {
        let kind = TextRows::kind_of(reader.as_mut())?;
        let rows = TextRows::open(reader, kind)?;
        let mut fields = Vec::new();
        let mut kept = Vec::new();
        for name in names {
            if !rows.columns.contains(name) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    missing_column(name, &rows.columns),
                ));
            }
            if !kept.contains(name) {
                fields.push(Field::new(output_name(name), DataType::Utf8, true));
                kept.push(name.clone());
            }
        }
        Ok(Self {
            source: KeptSource::Text { rows, names: kept },
            fields,
        })
    }

    fn read<T: ChunkReader + 'static>(source: T, names: &[String]) -> io::Result<Self> {
        let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        let builder = ParquetRecordBatchReaderBuilder::try_new(source)
            .map_err(|e| invalid(format!("not a readable Parquet file: {e}")))?;
        let schema = Arc::clone(builder.schema());
        let mut roots = Vec::new();
        for name in names {
            let index = schema.index_of(name).map_err(|_| {
                let columns: Vec<String> =
                    schema.fields().iter().map(|f| f.name().clone()).collect();
                invalid(missing_column(name, &columns))
            })?;
            roots.push(index);
        }
        roots.sort_unstable();
        roots.dedup();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let fields = roots
            .iter()
            .map(|&i| {
                let field = schema.field(i);
                Field::new(output_name(field.name()), field.data_type().clone(), true)
            })
            .collect();
        let reader = builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| invalid(format!("not a readable Parquet file: {e}")))?;
        Ok(Self {
            source: KeptSource::Parquet {
                reader,
                pending: None,
            },
            fields,
        })
    }

    /// The next `n` input rows' columns.
    fn take(&mut self, n: usize) -> io::Result<Vec<ArrayRef>> {
        match &mut self.source {
            KeptSource::Parquet { reader, pending } => take_batches(reader, pending, n),
            KeptSource::Text { rows, names } => take_text(rows, names, n),
        }
    }
}

/// What a kept column is called in the output: its own name, or, named as
/// one of the output's own columns, `input_NAME`.
fn output_name(name: &str) -> String {
    if OWN_COLUMNS.contains(&name) {
        format!("input_{name}")
    } else {
        name.to_owned()
    }
}

fn missing_column(name: &str, columns: &[String]) -> String {
    format!(
        "--keep-columns names the column {name:?}, which the input table does not have (its columns: {})",
        columns.join(", ")
    )
}

fn too_few_rows() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "--keep-columns: the input table has fewer rows than the job",
    )
}

/// The next `n` rows of a Parquet table's kept columns.
fn take_batches(
    reader: &mut ParquetRecordBatchReader,
    pending: &mut Option<RecordBatch>,
    n: usize,
) -> io::Result<Vec<ArrayRef>> {
    let mut parts: Vec<RecordBatch> = Vec::new();
    let mut have = 0;
    while have < n {
        let batch = match pending.take() {
            Some(batch) => batch,
            None => match reader.next() {
                Some(batch) => batch.map_err(io::Error::other)?,
                None => return Err(too_few_rows()),
            },
        };
        let wanted = (n - have).min(batch.num_rows());
        if wanted < batch.num_rows() {
            *pending = Some(batch.slice(wanted, batch.num_rows() - wanted));
        }
        have += wanted;
        parts.push(batch.slice(0, wanted));
    }
    let schema = parts.first().map(RecordBatch::schema);
    let joined = match schema {
        Some(schema) => {
            arrow_select::concat::concat_batches(&schema, &parts).map_err(io::Error::other)?
        }
        None => return Ok(Vec::new()),
    };
    Ok(joined.columns().to_vec())
}

/// The next `n` rows of a text table's kept columns, as text.
fn take_text(rows: &mut TextRows, names: &[String], n: usize) -> io::Result<Vec<ArrayRef>> {
    let mut columns: Vec<StringBuilder> = names.iter().map(|_| StringBuilder::new()).collect();
    for _ in 0..n {
        let row = rows.next_row()?.ok_or_else(too_few_rows)?;
        for (column, name) in columns.iter_mut().zip(names) {
            match row.get(name) {
                Some(Value::String(text)) => column.append_value(text),
                None | Some(Value::Null) => column.append_null(),
                Some(other) => column.append_value(other.to_string()),
            }
        }
    }
    Ok(columns
        .into_iter()
        .map(|mut column| Arc::new(column.finish()) as ArrayRef)
        .collect())
}

fn schema(kept: Option<&KeptColumns>) -> Arc<Schema> {
    let text = |name: &str| Field::new(name, DataType::Utf8, true);
    let count = |name: &str| Field::new(name, DataType::UInt64, true);
    let kept = kept.map(|k| k.fields.clone()).unwrap_or_default();
    Arc::new(Schema::new(
        [
            vec![
                Field::new("custom_id", DataType::Utf8, false),
                text("text"),
                text("finish_reason"),
                count("prompt_tokens"),
                count("completion_tokens"),
                text("error"),
                text("response"),
            ],
            kept,
        ]
        .concat(),
    ))
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

/// A JSONL file's rows, one at a time.
struct Rows {
    lines: io::Lines<BufReader<File>>,
    next: Option<Row>,
}

impl Rows {
    fn open(path: &Path) -> io::Result<Self> {
        let mut rows = Self {
            lines: BufReader::new(File::open(path)?).lines(),
            next: None,
        };
        rows.advance()?;
        Ok(rows)
    }

    /// Takes the row in hand and reads the one after it.
    fn advance(&mut self) -> io::Result<Option<Row>> {
        let taken = self.next.take();
        for line in self.lines.by_ref() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&line)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            self.next = Some(row_of(&value));
            break;
        }
        Ok(taken)
    }
}

/// Writes the table of a job's exported `results` and `errors` (JSONL, as
/// `cortex results` writes them, each in input order) into `output`, in
/// input order: the two files are merged a row at a time, so memory holds
/// one batch of rows, whatever the job's size. With `kept`, each row
/// carries those columns of its input row (the job's input, every row
/// answered: a finished job). Where the bytes go, and whether they replace
/// a file whole, is the caller's (`cortex_queue::OutputFile`).
pub fn write_results<W: Write + Send>(
    results: &Path,
    errors: &Path,
    output: W,
    kept: Option<KeptColumns>,
) -> io::Result<ResultTable> {
    write_table(Rows::open(results)?, Rows::open(errors)?, kept, output)
}

fn write_table(
    mut results: Rows,
    mut errors: Rows,
    mut kept: Option<KeptColumns>,
    output: impl Write + Send,
) -> io::Result<ResultTable> {
    let schema = schema(kept.as_ref());
    let mut writer =
        ArrowWriter::try_new(output, Arc::clone(&schema), None).map_err(io::Error::other)?;
    let mut counted = ResultTable {
        results: 0,
        errors: 0,
    };
    let mut chunk = Vec::with_capacity(BATCH_ROWS);
    loop {
        // The row of the lower input line next.
        let from_results = match (&results.next, &errors.next) {
            (Some(r), Some(e)) => r.line <= e.line,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let row = if from_results {
            counted.results += 1;
            results.advance()?
        } else {
            counted.errors += 1;
            errors.advance()?
        };
        if let Some(row) = row {
            let row_number = counted.results + counted.errors;
            if kept.is_some() && row.line != row_number {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "--keep-columns: output row {row_number} answers input line {}: not every input row has its answer (keep columns of a finished job)",
                        row.line
                    ),
                ));
            }
            chunk.push(row);
        }
        if chunk.len() == BATCH_ROWS {
            write_batch(&mut writer, &schema, &chunk, kept.as_mut())?;
            chunk.clear();
        }
    }
    if !chunk.is_empty() {
        write_batch(&mut writer, &schema, &chunk, kept.as_mut())?;
    }
    writer.close().map_err(io::Error::other)?;
    Ok(counted)
}

fn write_batch<W: Write + Send>(
    writer: &mut ArrowWriter<W>,
    schema: &Arc<Schema>,
    chunk: &[Row],
    kept: Option<&mut KeptColumns>,
) -> io::Result<()> {
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
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(custom_id.finish()),
        Arc::new(text.finish()),
        Arc::new(finish_reason.finish()),
        Arc::new(prompt_tokens.finish()),
        Arc::new(completion_tokens.finish()),
        Arc::new(error.finish()),
        Arc::new(response.finish()),
    ];
    if let Some(kept) = kept {
        columns.extend(kept.take(chunk.len())?);
    }
    let batch = RecordBatch::try_new(Arc::clone(schema), columns).map_err(io::Error::other)?;
    writer.write(&batch).map_err(io::Error::other)?;
    Ok(())
}
