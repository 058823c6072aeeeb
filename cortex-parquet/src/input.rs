//! Table rows as input lines.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use arrow_array::RecordBatch;
use cortex_objects::RemoteObject;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::file::reader::ChunkReader;
use serde_json::{Map, Value};

use crate::remote::ObjectChunks;

/// Rows read at a time.
const BATCH_ROWS: usize = 1024;

/// Whether the object is Parquet (it starts with `PAR1`).
pub fn is_parquet_object(object: &RemoteObject) -> io::Result<bool> {
    Ok(object.read_range(0..4)?.as_ref() == b"PAR1")
}

/// Whether the file at `path` is Parquet (it starts with `PAR1`).
pub fn is_parquet(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path)?;
    let mut read = 0;
    while read < magic.len() {
        match file.read(&mut magic[read..])? {
            0 => return Ok(false),
            n => read += n,
        }
    }
    Ok(&magic == b"PAR1")
}

/// How a table's rows become requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableInput {
    /// A chat's user message made from each row: `{column}` is replaced by
    /// the row's value (text as it is, anything else as JSON; `{{` and `}}`
    /// are braces). `None`: each row is a line as it stands.
    pub prompt_template: Option<String>,
    /// The column whose value is each row's `custom_id` (with a template;
    /// else the row number).
    pub id_column: Option<String>,
}

/// A Parquet file's rows as JSONL input lines, one row per line (`Read`).
pub struct RowLines {
    reader: ParquetRecordBatchReader,
    table: TableInput,
    /// The template cut into text and column names.
    template: Option<Vec<Piece>>,
    /// Bytes ready to be read.
    ready: VecDeque<u8>,
    row: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Column(String),
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Cuts a template into text and `{column}` references.
fn pieces(template: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                if name.is_empty() {
                    return Err("the prompt template has an empty {} (write {{ for a brace)".into());
                }
                out.push(Piece::Text(std::mem::take(&mut text)));
                out.push(Piece::Column(name));
            }
            '}' => return Err("the prompt template has a lone } (write }} for a brace)".into()),
            c => text.push(c),
        }
    }
    out.push(Piece::Text(text));
    Ok(out)
}

impl RowLines {
    /// Opens `path`, checking that the columns the template and
    /// `id_column` name exist.
    pub fn open(path: &Path, table: &TableInput) -> io::Result<Self> {
        Self::read(File::open(path)?, table)
    }

    /// Opens an object in a store (read in cached ranges, each of the
    /// version first seen), as [`RowLines::open`] a file.
    pub fn open_object(object: &RemoteObject, table: &TableInput) -> io::Result<Self> {
        Self::read(ObjectChunks::new(object.clone()), table)
    }

    fn read<T: ChunkReader + 'static>(source: T, table: &TableInput) -> io::Result<Self> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(source)
            .map_err(|e| invalid(format!("not a readable Parquet file: {e}")))?;
        let columns: Vec<String> = builder
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let known = |name: &str, what: &str| {
            if columns.iter().any(|c| c == name) {
                Ok(())
            } else {
                Err(invalid(format!(
                    "{what} names the column {name:?}, which the table does not have (its columns: {})",
                    columns.join(", ")
                )))
            }
        };
        let template = match &table.prompt_template {
            Some(text) => {
                let pieces = pieces(text).map_err(invalid)?;
                for piece in &pieces {
                    if let Piece::Column(name) = piece {
                        known(name, "the prompt template")?;
                    }
                }
                Some(pieces)
            }
            None => None,
        };
        if let Some(id) = &table.id_column {
            known(id, "--id-column")?;
        }
        let reader = builder
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| invalid(format!("not a readable Parquet file: {e}")))?;
        Ok(Self {
            reader,
            table: table.clone(),
            template,
            ready: VecDeque::new(),
            row: 0,
        })
    }

    /// Turns the next batch of rows into lines; false at the end.
    fn fill(&mut self) -> io::Result<bool> {
        let Some(batch) = self.reader.next() else {
            return Ok(false);
        };
        let batch = batch.map_err(|e| invalid(format!("row {}: {e}", self.row + 1)))?;
        for row in rows(&batch)? {
            self.row += 1;
            let line = self.line(row)?;
            self.ready.extend(line.to_string().as_bytes());
            self.ready.push_back(b'\n');
        }
        Ok(true)
    }

    /// One row as an input line.
    fn line(&self, mut row: Map<String, Value>) -> io::Result<Value> {
        let Some(template) = &self.template else {
            // Columns that may hold JSON text are read as the JSON they hold.
            for key in ["body", "messages"] {
                if let Some(Value::String(text)) = row.get(key)
                    && let Ok(value) = serde_json::from_str::<Value>(text)
                {
                    row.insert(key.into(), value);
                }
            }
            return Ok(Value::Object(row));
        };
        let mut prompt = String::new();
        for piece in template {
            match piece {
                Piece::Text(text) => prompt.push_str(text),
                Piece::Column(name) => match row.get(name) {
                    Some(Value::String(text)) => prompt.push_str(text),
                    None | Some(Value::Null) => {}
                    Some(other) => prompt.push_str(&other.to_string()),
                },
            }
        }
        let custom_id = match &self.table.id_column {
            Some(column) => match row.get(column) {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Null) | None => {
                    return Err(invalid(format!(
                        "row {}: the id column {column:?} is empty",
                        self.row
                    )));
                }
                Some(other) => other.to_string(),
            },
            None => self.row.to_string(),
        };
        Ok(serde_json::json!({
            "custom_id": custom_id,
            "messages": [{ "role": "user", "content": prompt }],
        }))
    }
}

/// A batch's rows as JSON objects, as Arrow writes them.
fn rows(batch: &RecordBatch) -> io::Result<Vec<Map<String, Value>>> {
    let mut buffer = Vec::new();
    {
        let mut writer = arrow_json::LineDelimitedWriter::new(&mut buffer);
        writer
            .write(batch)
            .map_err(|e| invalid(format!("a column cannot be read as JSON: {e}")))?;
        writer
            .finish()
            .map_err(|e| invalid(format!("a column cannot be read as JSON: {e}")))?;
    }
    let mut out = Vec::with_capacity(batch.num_rows());
    for line in buffer.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        match serde_json::from_slice(line) {
            Ok(Value::Object(row)) => out.push(row),
            _ => return Err(invalid("a row is not an object".into())),
        }
    }
    // Rows whose every column is null come out as `{}`; none is skipped.
    out.resize_with(batch.num_rows(), Map::new);
    Ok(out)
}

impl Read for RowLines {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.ready.is_empty() {
            if !self.fill()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.ready.len());
        for (slot, byte) in buf.iter_mut().zip(self.ready.drain(..n)) {
            *slot = byte;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_columns_and_escape_braces() {
        assert_eq!(
            pieces("Summarise {{this}}: {text}").unwrap(),
            [
                Piece::Text("Summarise {this}: ".into()),
                Piece::Column("text".into()),
                Piece::Text(String::new()),
            ]
        );
        assert!(pieces("a {} b").is_err());
        assert!(pieces("a } b").is_err());
    }
}
