//! Table rows as input lines.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, Read};
use std::path::Path;

use arrow_array::RecordBatch;
use cortex_objects::RemoteObject;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::file::reader::ChunkReader;
use serde_json::{Map, Value};

use crate::remote::ObjectChunks;

/// A JSON array's elements as JSONL lines, an element a line (compact, in
/// order), and how many there are: what people write with `json.dump` of a
/// list becomes the lines a job reads, its element N line N.
pub fn json_array_lines(mut reader: impl Read) -> io::Result<(Box<dyn BufRead>, usize)> {
    let mut text = Vec::new();
    reader.read_to_end(&mut text)?;
    let text = text.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&text);
    let elements: Vec<Value> = serde_json::from_slice(text).map_err(|e| {
        invalid(format!(
            "it starts as a JSON array but is not one ({e}); write an array of request objects, or JSONL: one object a line"
        ))
    })?;
    let mut lines = Vec::with_capacity(text.len());
    for element in &elements {
        serde_json::to_writer(&mut lines, element).map_err(io::Error::other)?;
        lines.push(b'\n');
    }
    Ok((Box::new(io::Cursor::new(lines)), elements.len()))
}

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

/// A table kept as text: JSONL rows (each line an object whose keys are
/// the columns) or CSV (a header row names the columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextTable {
    /// One JSON object per line.
    Jsonl,
    /// Comma-separated values, the first row naming the columns.
    Csv,
    /// One JSON array of objects (what `json.dump` of a list writes), an
    /// element a row: read whole, then an element a line.
    JsonArray,
}

impl TextTable {
    /// What a text file holds, judged by its first line that is not blank:
    /// JSONL when it is a JSON object, CSV when it is a header of names
    /// (more than one, comma-separated), `None` when it is neither.
    pub fn of_first_line(line: &str) -> Option<TextTable> {
        let line = line.trim_start_matches('\u{feff}').trim();
        if line.starts_with('{') {
            return Some(TextTable::Jsonl);
        }
        if line.starts_with('[') {
            return Some(TextTable::JsonArray);
        }
        let names = csv_fields(line).ok()?;
        (names.len() > 1 && names.iter().all(|name| !name.trim().is_empty()))
            .then_some(TextTable::Csv)
    }
}

/// Where rows come from.
enum RowSource {
    Parquet(ParquetRecordBatchReader),
    Text(TextRows),
}

/// A text table's rows, each a JSON object of its columns: what the input
/// reads through a template and `--keep-columns` carries into the output.
pub(crate) struct TextRows {
    source: TextSource,
    /// The table's columns: a CSV's header, a JSONL table's first row's keys.
    pub(crate) columns: Vec<String>,
    /// Rows read so far (blank lines are not rows).
    row: u64,
}

enum TextSource {
    Jsonl(Box<dyn BufRead>),
    Csv {
        reader: Box<dyn BufRead>,
        header: Vec<String>,
    },
}

impl TextRows {
    /// The rows of `reader`, a text table of `kind`.
    pub(crate) fn open(mut reader: Box<dyn BufRead>, kind: TextTable) -> io::Result<Self> {
        let (source, columns) = match kind {
            TextTable::Csv => {
                let header = next_csv_record(&mut reader)?
                    .ok_or_else(|| invalid("the table is empty: no header row".into()))?;
                let header: Vec<String> = header
                    .into_iter()
                    .map(|name| name.trim_start_matches('\u{feff}').trim().to_owned())
                    .collect();
                let columns = header.clone();
                (TextSource::Csv { reader, header }, columns)
            }
            TextTable::Jsonl => {
                let columns = first_row_keys(reader.as_mut())?;
                (TextSource::Jsonl(reader), columns)
            }
            TextTable::JsonArray => {
                let (mut lines, _) = json_array_lines(reader)?;
                let columns = first_row_keys(lines.as_mut())?;
                (TextSource::Jsonl(lines), columns)
            }
        };
        Ok(Self {
            source,
            columns,
            row: 0,
        })
    }

    /// What a text input holds, peeked (not read) from its first line
    /// that is not blank: JSONL unless that line is a CSV header or opens
    /// an array.
    pub(crate) fn kind_of(reader: &mut dyn BufRead) -> io::Result<TextTable> {
        let text = String::from_utf8_lossy(reader.fill_buf()?).into_owned();
        let first = text.lines().find(|line| !line.trim().is_empty());
        Ok(first
            .and_then(TextTable::of_first_line)
            .unwrap_or(TextTable::Jsonl))
    }

    /// The next row; `None` at the end.
    pub(crate) fn next_row(&mut self) -> io::Result<Option<Map<String, Value>>> {
        let row = self.row + 1;
        let read = match &mut self.source {
            TextSource::Jsonl(reader) => {
                let mut line = String::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line)? == 0 {
                        return Ok(None);
                    }
                    if !line.trim().is_empty() {
                        break;
                    }
                }
                match serde_json::from_str(&line) {
                    Ok(Value::Object(read)) => read,
                    _ => {
                        return Err(invalid(format!(
                            "row {row}: not a JSON object (a JSONL table has one object per line)"
                        )));
                    }
                }
            }
            TextSource::Csv { reader, header } => loop {
                let Some(record) = next_csv_record(reader.as_mut())
                    .map_err(|e| invalid(format!("row {row}: {e}")))?
                else {
                    return Ok(None);
                };
                if record.len() == 1 && record[0].is_empty() {
                    continue; // a blank line
                }
                if record.len() != header.len() {
                    return Err(invalid(format!(
                        "row {row}: {} fields where the header names {} columns",
                        record.len(),
                        header.len()
                    )));
                }
                break header
                    .iter()
                    .cloned()
                    .zip(record.into_iter().map(Value::String))
                    .collect();
            },
        };
        self.row = row;
        Ok(Some(read))
    }
}

/// A table's rows as JSONL input lines, one row per line (`Read`): a
/// Parquet file's, or a text table's (JSONL rows or CSV) through a template.
pub struct RowLines {
    source: RowSource,
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

/// The template cut into pieces, with every column it and the id column
/// name checked against the table's `columns`.
fn checked_template(table: &TableInput, columns: &[String]) -> io::Result<Option<Vec<Piece>>> {
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
    Ok(template)
}

/// The keys of a JSONL table's first row, left unread (the reader is
/// buffered: the row is peeked, not consumed).
fn first_row_keys(reader: &mut dyn BufRead) -> io::Result<Vec<String>> {
    loop {
        let buffered = reader.fill_buf()?;
        if buffered.is_empty() {
            return Err(invalid("the table is empty: no rows".into()));
        }
        let Some(end) = buffered.iter().position(|&b| b == b'\n') else {
            return Err(invalid(
                "the first row is longer than the reader's buffer, or has no end of line".into(),
            ));
        };
        let line = &buffered[..end];
        if line.iter().all(u8::is_ascii_whitespace) {
            reader.consume(end + 1);
            continue;
        }
        return match serde_json::from_slice(line) {
            Ok(Value::Object(row)) => Ok(row.keys().cloned().collect()),
            _ => Err(invalid(
                "row 1: not a JSON object (a JSONL table has one object per line)".into(),
            )),
        };
    }
}

/// The fields of one CSV line (RFC 4180: commas, fields in double quotes
/// with `""` for a quote); an error for a quote left open.
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut reader = io::Cursor::new(format!("{line}\n"));
    next_csv_record(&mut reader)
        .map_err(|e| e.to_string())
        .map(Option::unwrap_or_default)
}

/// The next CSV record (RFC 4180; a quoted field may hold commas, quotes
/// written `""` and line breaks), or `None` at the end.
fn next_csv_record(reader: &mut dyn BufRead) -> io::Result<Option<Vec<String>>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut at_start = true;
    loop {
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (false, '"') if at_start => {
                    quoted = true;
                    at_start = false;
                }
                (true, '"') if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                (true, '"') => quoted = false,
                (false, ',') => {
                    fields.push(std::mem::take(&mut field));
                    at_start = true;
                }
                (false, '\r' | '\n') => {}
                (_, c) => {
                    field.push(c);
                    at_start = false;
                }
            }
        }
        if !quoted {
            break;
        }
        // A line break inside quotes: the record goes on.
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(invalid("a quoted field is not closed".into()));
        }
    }
    fields.push(field);
    Ok(Some(fields))
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
        let template = checked_template(table, &columns)?;
        let reader = builder
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| invalid(format!("not a readable Parquet file: {e}")))?;
        Ok(Self {
            source: RowSource::Parquet(reader),
            table: table.clone(),
            template,
            ready: VecDeque::new(),
            row: 0,
        })
    }

    /// Reads a text table (JSONL rows or CSV) whose rows become chats
    /// through `table`'s template, which it must have. A CSV's header
    /// names its columns; a JSONL table's first row does (a later row
    /// without a column has it empty, as a null in Parquet).
    pub fn open_text(
        reader: Box<dyn BufRead>,
        kind: TextTable,
        table: &TableInput,
    ) -> io::Result<Self> {
        if table.prompt_template.is_none() {
            return Err(invalid(
                "a CSV or JSONL table's rows become requests through --prompt-template".into(),
            ));
        }
        let rows = TextRows::open(reader, kind)?;
        let columns = rows.columns.clone();
        let source = RowSource::Text(rows);
        let template = checked_template(table, &columns)?;
        Ok(Self {
            source,
            table: table.clone(),
            template,
            ready: VecDeque::new(),
            row: 0,
        })
    }

    /// Turns the next rows into lines; false at the end.
    fn fill(&mut self) -> io::Result<bool> {
        let rows = match &mut self.source {
            RowSource::Parquet(reader) => {
                let Some(batch) = reader.next() else {
                    return Ok(false);
                };
                let batch = batch.map_err(|e| invalid(format!("row {}: {e}", self.row + 1)))?;
                rows(&batch)?
            }
            RowSource::Text(rows) => match rows.next_row()? {
                Some(row) => vec![row],
                None => return Ok(false),
            },
        };
        for row in rows {
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

    fn lines_of(
        text: &str,
        kind: TextTable,
        template: &str,
        id: Option<&str>,
    ) -> io::Result<String> {
        let table = TableInput {
            prompt_template: Some(template.into()),
            id_column: id.map(str::to_owned),
        };
        let reader: Box<dyn BufRead> = Box::new(io::Cursor::new(text.to_owned()));
        let mut out = String::new();
        RowLines::open_text(reader, kind, &table)?.read_to_string(&mut out)?;
        Ok(out)
    }

    #[test]
    fn csv_fields_follow_rfc_4180() {
        assert_eq!(csv_fields("id,text").unwrap(), ["id", "text"]);
        assert_eq!(
            csv_fields(r#"1,"a, ""quoted"" one",x"#).unwrap(),
            ["1", r#"a, "quoted" one"#, "x"]
        );
        assert_eq!(csv_fields("a,,").unwrap(), ["a", "", ""]);
        assert!(csv_fields(r#"1,"open"#).is_err());
    }

    #[test]
    fn a_text_file_is_judged_by_its_first_line() {
        assert_eq!(
            TextTable::of_first_line(r#" {"id": 1}"#),
            Some(TextTable::Jsonl)
        );
        assert_eq!(
            TextTable::of_first_line("id,text\r\n"),
            Some(TextTable::Csv)
        );
        assert_eq!(
            TextTable::of_first_line("\u{feff}id,text"),
            Some(TextTable::Csv)
        );
        assert_eq!(TextTable::of_first_line("Just some prose."), None);
        assert_eq!(TextTable::of_first_line("a,"), None);
    }

    #[test]
    fn csv_and_jsonl_rows_become_chats_through_the_template() {
        let csv = "id,text\n7,\"one, two\"\n\n8,\"multi\nline\"\n";
        let lines = lines_of(csv, TextTable::Csv, "Sum: {text}", Some("id")).unwrap();
        let rows: Vec<Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["custom_id"], "7");
        assert_eq!(rows[0]["messages"][0]["content"], "Sum: one, two");
        assert_eq!(rows[1]["messages"][0]["content"], "Sum: multi\nline");

        let jsonl = "{\"id\": 1, \"text\": \"a\"}\n\n{\"id\": 2}\n";
        let lines = lines_of(jsonl, TextTable::Jsonl, "Say {text}", Some("id")).unwrap();
        let rows: Vec<Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows[0]["custom_id"], "1");
        assert_eq!(rows[0]["messages"][0]["content"], "Say a");
        assert_eq!(rows[1]["messages"][0]["content"], "Say ");
    }

    #[test]
    fn text_tables_name_what_is_wrong() {
        let missing = lines_of("id,body\n1,x\n", TextTable::Csv, "{text}", None).unwrap_err();
        assert!(
            missing.to_string().contains(r#"the column "text""#),
            "{missing}"
        );
        assert!(missing.to_string().contains("id, body"), "{missing}");
        let short = lines_of("id,text\n1\n", TextTable::Csv, "{text}", None).unwrap_err();
        assert!(
            short
                .to_string()
                .contains("row 1: 1 fields where the header names 2"),
            "{short}"
        );
        let broken = lines_of(
            "{\"text\": 1}\nnot json\n",
            TextTable::Jsonl,
            "{text}",
            None,
        )
        .unwrap_err();
        assert!(
            broken.to_string().contains("row 2: not a JSON object"),
            "{broken}"
        );
    }
}
