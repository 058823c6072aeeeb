//! Writing a job's results where the user asked: a local file, written under
//! a temporary name and renamed (a device, a pipe or stdout, `-`, written
//! into as it is: `cortex_queue::OutputFile`), or an object, staged here and
//! uploaded as one multipart upload that appears whole when it completes.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use cortex_objects::{Location, ObjectLocation, PART_SIZE};
use cortex_openai::ExportJsonl;
use cortex_parquet::KeptColumns;
use cortex_queue::{Destination, JobId, OutputFile, Queue, failpoint};
use cortex_webhooks::Exporter;

/// What an export wrote.
pub(crate) struct Exported {
    pub(crate) output: Location,
    pub(crate) errors_to: Location,
    pub(crate) results: u64,
    pub(crate) errors: u64,
    /// The first result lines (JSONL outputs), for a taste of the answers
    /// (none when they went to a stream, which cannot be read back).
    pub(crate) first_lines: Vec<String>,
}

impl Exported {
    /// What the results are counted in: a table's rows, a file's lines.
    pub(crate) fn result_unit(&self) -> &'static str {
        let table = self
            .output
            .file_name()
            .is_some_and(|name| is_table(Path::new(&name)));
        if table { "row" } else { "line" }
    }

    /// Whether the results went to this process's stdout, where nothing
    /// else may be printed.
    pub(crate) fn on_stdout(&self) -> bool {
        is_stdout(&self.output)
    }
}

/// The name of stdout as an output (`-o -`).
pub(crate) const STDOUT: &str = "-";

/// Where an output named on the command line goes: `-` is stdout.
pub(crate) fn output_location(text: &str) -> anyhow::Result<Location> {
    if text == STDOUT {
        return Ok(Location::Local(PathBuf::from("/dev/stdout")));
    }
    Ok(Location::parse(text)?)
}

/// Whether `location` is this process's stdout.
pub(crate) fn is_stdout(location: &Location) -> bool {
    location.local().is_some_and(|path| {
        [
            Path::new("/dev/stdout"),
            Path::new("/dev/fd/1"),
            Path::new("/proc/self/fd/1"),
        ]
        .contains(&path)
    })
}

/// Where a command writes a job's results and its error file, settled
/// before any work: one rule for `cortex run` and `cortex results`.
pub(crate) struct Outputs {
    pub(crate) results: Location,
    pub(crate) errors: Location,
}

impl Outputs {
    /// `-o` and `--errors` as given, else named after `name` (the input's
    /// file name for `run`, `job-N` for `results`): `NAME.results.jsonl`
    /// here, and the error file beside the results, named after them (`-o
    /// sub/titles.parquet`: `sub/titles.errors.jsonl`), or `NAME.errors.jsonl`
    /// here when the results go to a stream (stdout, a device).
    pub(crate) fn choose(
        output: Option<&str>,
        errors: Option<&str>,
        name: &str,
    ) -> anyhow::Result<Self> {
        let results = match output {
            Some(text) => output_location(text)?,
            None => Location::Local(PathBuf::from(format!("{name}.results.jsonl"))),
        };
        let errors = match errors {
            Some(text) => output_location(text)?,
            None => errors_beside(&results, name),
        };
        Ok(Self { results, errors })
    }

    /// Refuses, before anything is submitted or generated, an output that
    /// would replace a file the command reads, and one that cannot be
    /// created here and now (see [`Outputs::refuse_replacing`],
    /// [`Outputs::check_creatable`]).
    pub(crate) fn check(&self, reads: &[ReadFile]) -> anyhow::Result<()> {
        self.refuse_replacing(reads)?;
        self.check_creatable()
    }

    /// Refuses an output that would replace a file the command reads
    /// (compared by device and inode, so another name of it, a link or a
    /// hard link, is caught too).
    pub(crate) fn refuse_replacing(&self, reads: &[ReadFile]) -> anyhow::Result<()> {
        for (what, location) in [("results", &self.results), ("error file", &self.errors)] {
            let Location::Local(path) = location else {
                continue;
            };
            if let Some(read) = reads.iter().find(|read| same_file(path, &read.path)) {
                return Err(crate::exit::Usage(format!(
                    "refusing to write the {what} to {}: it is {} ({}), which would be lost; name another file{}",
                    path.display(),
                    read.what,
                    read.path.display(),
                    if what == "results" { " with -o" } else { " with --errors, or another -o" },
                ))
                .into());
            }
        }
        Ok(())
    }

    /// Refuses an output that cannot be created.
    pub(crate) fn check_creatable(&self) -> anyhow::Result<()> {
        for (what, location) in [("results", &self.results), ("error file", &self.errors)] {
            match location {
                // A file (or a new path): a temporary file made beside it and
                // removed, the export's own first step, whose error names the
                // place. A stream (stdout, a device, a FIFO) is left unopened:
                // opening a FIFO would hand its reader an empty file.
                Location::Local(path) => {
                    if let Ok(Destination::Replace(_)) | Err(_) = Destination::of(path) {
                        OutputFile::create(path).map(drop)?;
                    }
                }
                Location::Object(object) => object
                    .check_writable()
                    .with_context(|| format!("cannot write the {what} to {location}"))?,
            }
        }
        Ok(())
    }
}

/// A file a command reads, which none of its outputs may replace.
pub(crate) struct ReadFile {
    pub(crate) path: PathBuf,
    /// What it is to the command, as an error names it ("the input").
    pub(crate) what: &'static str,
}

impl ReadFile {
    pub(crate) fn new(path: impl Into<PathBuf>, what: &'static str) -> Self {
        Self {
            path: path.into(),
            what,
        }
    }
}

/// Whether two names lead to one file (links followed); a name that leads
/// nowhere yet is no file a command reads.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The name a job's default outputs are named after: the input's file name,
/// less a `.jsonl` (`prompts.jsonl`: `prompts`, whose results are
/// `prompts.results.jsonl`), whole otherwise (`bom.csv`: `bom.csv`), so that
/// two inputs that differ only in their extension never share results.
pub(crate) fn output_name(input: &Location) -> String {
    let name = input.file_name().unwrap_or_else(|| "job".into());
    match name.len().checked_sub(".jsonl".len()) {
        Some(cut)
            if cut > 0
                && name.is_char_boundary(cut)
                && name[cut..].eq_ignore_ascii_case(".jsonl") =>
        {
            name[..cut].to_owned()
        }
        _ => name,
    }
}

/// The error file that goes with `output`: beside it, named after it
/// (`sub/titles.parquet`: `sub/titles.errors.jsonl`; the default
/// `in.results.jsonl`: `in.errors.jsonl`), or, when the results go to a
/// stream (stdout, a device), `{name}.errors.jsonl` here.
pub(crate) fn errors_beside(output: &Location, name: &str) -> Location {
    let streamed = output
        .local()
        .is_some_and(|path| matches!(Destination::of(path), Ok(Destination::Stream)));
    if streamed {
        return Location::Local(PathBuf::from(format!("{name}.errors.jsonl")));
    }
    let stem = output.file_stem().unwrap_or_else(|| name.to_owned());
    let stem = stem.strip_suffix(".results").unwrap_or(&stem);
    output.with_file_name(&format!("{stem}.errors.jsonl"))
}

/// Exports a job to `output`: OpenAI's JSONL, or, for a `.parquet` name,
/// one table of results and errors in input order (the errors also as JSONL
/// in `errors`, as always), with the `keep` columns of the input table.
pub(crate) fn export_job(
    store: &mut dyn Queue,
    job: JobId,
    output: &Location,
    errors: &Location,
    partial: bool,
    keep: Option<&KeepColumns<'_>>,
) -> anyhow::Result<Exported> {
    // Objects are written here first, then uploaded.
    let staging = match (output, errors) {
        (Location::Local(_), Location::Local(_)) => None,
        _ => Some(tempfile::tempdir().context("cannot make a folder to stage the upload in")?),
    };
    let local = |location: &Location, fallback: &str| -> PathBuf {
        match (location, &staging) {
            (Location::Local(path), _) => path.clone(),
            (Location::Object(_), Some(dir)) => dir
                .path()
                .join(location.file_name().unwrap_or_else(|| fallback.into())),
            (Location::Object(_), None) => unreachable!("objects are staged"),
        }
    };
    let output_path = local(output, "results.jsonl");
    let mut errors_path = local(errors, "errors.jsonl");
    let replaces_files = |path: &Path| matches!(Destination::of(path), Ok(Destination::Replace(_)));
    if errors_path == output_path && replaces_files(&output_path) {
        errors_path.set_extension("errors.jsonl");
    }
    let table = is_table(&output_path);
    let kept = match keep {
        Some(keep) => {
            check_table_output(output)?;
            Some(keep.open()?)
        }
        None => None,
    };
    let summary = if table {
        let staging = tempfile::tempdir().context("cannot make a folder to stage the table in")?;
        let staged = staging.path().join("results.jsonl");
        let summary = store.export(job, &staged, Some(&errors_path), partial)?;
        let mut file = OutputFile::create(&output_path)?;
        cortex_parquet::write_results(&staged, &errors_path, file.writer(), kept)
            .with_context(|| format!("cannot write {}", output_path.display()))?;
        file.finish()?;
        summary
    } else {
        store.export(job, &output_path, Some(&errors_path), partial)?
    };
    let first_lines = if table || !replaces_files(&output_path) {
        Vec::new()
    } else {
        BufReader::new(File::open(&output_path)?)
            .lines()
            .take(3)
            .collect::<Result<_, _>>()?
    };
    for (location, path) in [(output, &output_path), (errors, &errors_path)] {
        if let Location::Object(object) = location {
            upload(path, object)?;
        }
    }
    Ok(Exported {
        output: output.clone(),
        errors_to: errors.clone(),
        results: summary.results,
        errors: summary.errors,
        first_lines,
    })
}

/// Input columns to carry into a table of results (`--keep-columns`).
pub(crate) struct KeepColumns<'a> {
    /// The job's input.
    pub(crate) input: &'a Location,
    /// The columns.
    pub(crate) names: &'a [String],
    /// Whether the input's rows became requests through a template (a
    /// text table's rows are its requests only then).
    pub(crate) templated: bool,
}

impl KeepColumns<'_> {
    /// Whether the columns can be kept in `output`: a table, and the
    /// columns in the input's.
    pub(crate) fn check(&self, output: &Location) -> anyhow::Result<()> {
        check_table_output(output)?;
        self.open().map(drop)
    }

    /// The input table's columns, read again from where it was: a Parquet
    /// file, or a text table (CSV, JSONL rows, a JSON array) whose rows
    /// became requests through a template.
    fn open(&self) -> anyhow::Result<KeptColumns> {
        let input = self.input;
        let only_templated = || -> anyhow::Result<()> {
            if self.templated {
                return Ok(());
            }
            Err(crate::exit::Usage(format!(
                "--keep-columns carries a table's columns: {input} is neither a Parquet file nor rows read through --prompt-template"
            ))
            .into())
        };
        let opened = match input {
            Location::Local(path) => {
                if cortex_parquet::is_parquet(path)? {
                    KeptColumns::open(path, self.names)
                } else {
                    only_templated()?;
                    let file = File::open(path).with_context(|| format!("cannot read {input}"))?;
                    KeptColumns::open_text(Box::new(BufReader::new(file)), self.names)
                }
            }
            // The object opened once: its version read as a table is the one checked.
            Location::Object(object) => {
                let object = object.open()?;
                if cortex_parquet::is_parquet_object(&object)? {
                    KeptColumns::open_object(&object, self.names)
                } else {
                    only_templated()?;
                    KeptColumns::open_text(Box::new(BufReader::new(object.reader())), self.names)
                }
            }
        };
        // A column the table does not have is bad input, as a template's is.
        opened.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => {
                crate::exit::BadInput(format!("{input}: {e}")).into()
            }
            _ => anyhow::Error::new(e).context(format!("cannot read {input}")),
        })
    }
}

fn check_table_output(output: &Location) -> anyhow::Result<()> {
    let to_table = output
        .file_name()
        .is_some_and(|name| is_table(Path::new(&name)));
    if !to_table {
        return Err(crate::exit::Usage(
            "--keep-columns carries input columns into a table: name a .parquet output (-o FILE.parquet)"
                .into(),
        )
        .into());
    }
    Ok(())
}

/// Whether an output path names a table (`.parquet`).
fn is_table(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Writes a job's results to the destination it carries (`submit
/// --output`), its error file beside: what a worker or server does with the
/// outbox's `export` row when the job ends.
pub(crate) fn export_to_destination(
    store: &mut dyn Queue,
    job: JobId,
    url: &str,
) -> anyhow::Result<Exported> {
    let outputs = Outputs::choose(Some(url), None, "results")?;
    export_job(store, job, &outputs.results, &outputs.errors, false, None)
}

/// How this binary writes the outbox's exports (`submit --output`), beside
/// a worker, a run or a server.
pub(crate) fn exporter() -> Exporter {
    Exporter::new(|store, event| {
        let exported = export_to_destination(store, event.job, &event.url)
            .map_err(|e| format!("{}: {e:#}", event.url))?;
        tracing::info!(job = %event.job, results = exported.results, errors = exported.errors, "results written to {}", exported.output);
        Ok(())
    })
}

/// Uploads a local file as one object, a part at a time: it appears when
/// the last part is in, never half (the failpoint `upload` dies after a
/// part, as a kill would).
fn upload(from: &Path, to: &ObjectLocation) -> anyhow::Result<()> {
    let mut file = File::open(from).with_context(|| format!("cannot read {}", from.display()))?;
    let mut writer = to.create()?;
    let mut part = vec![0u8; PART_SIZE];
    loop {
        let filled = fill(&mut file, &mut part)?;
        if filled == 0 {
            break;
        }
        writer.write_all(&part[..filled])?;
        failpoint::hit("upload", "");
    }
    writer.finish()?;
    Ok(())
}

/// Reads until `buf` is full or the file ends.
fn fill(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}
