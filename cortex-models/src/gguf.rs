//! A reader for GGUF headers: enough to tell a good model file from a missing,
//! foreign or truncated one before llama.cpp sees it, and to show its metadata.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::path::{Path, PathBuf};

/// A metadata value (arrays are summarised by their element type and length).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    Uint(u64),
    /// Any signed integer type.
    Int(i64),
    /// `f32` or `f64`.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(String),
    /// An array: its element type id and length.
    Array {
        /// GGUF type id of the elements.
        element_type: u32,
        /// Number of elements.
        len: u64,
    },
}

impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::Uint(v) => write!(f, "{v}"),
            GgufValue::Int(v) => write!(f, "{v}"),
            GgufValue::Float(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(v) => write!(f, "{v}"),
            GgufValue::Array { len, .. } => write!(f, "[{len} entries]"),
        }
    }
}

/// What a GGUF file's header says.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufInfo {
    /// Format version (2 or 3).
    pub version: u32,
    /// Number of tensors.
    pub tensor_count: u64,
    /// Key/value metadata.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Total parameters (elements of all tensors).
    pub parameters: u64,
    /// Bytes the file must have to hold every tensor.
    pub required_size: u64,
    /// Bytes it has.
    pub file_size: u64,
    /// Its matrices (tensors with more than one row): what a model's
    /// products are computed with.
    pub matrices: Vec<GgufMatrix>,
}

/// A tensor of a GGUF with more than one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufMatrix {
    /// Its ggml type (`GGML_TYPE_*`).
    pub ggml_type: u32,
    /// Elements in a row.
    pub columns: u64,
    /// Rows (its second dimension).
    pub rows: u64,
    /// Whether it has more than two dimensions that are not 1 (a stack of
    /// matrices, such as a mixture of experts' weights).
    pub stacked: bool,
}

impl GgufInfo {
    /// A metadata string.
    pub fn string(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key) {
            Some(GgufValue::String(s)) => Some(s),
            _ => None,
        }
    }

    /// A metadata unsigned integer.
    pub fn uint(&self, key: &str) -> Option<u64> {
        match self.metadata.get(key) {
            Some(GgufValue::Uint(v)) => Some(*v),
            Some(GgufValue::Int(v)) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// `general.architecture` (e.g. `llama`).
    pub fn architecture(&self) -> Option<&str> {
        self.string("general.architecture")
    }

    /// The context length the model was trained with.
    pub fn context_length(&self) -> Option<u64> {
        self.uint(&format!("{}.context_length", self.architecture()?))
    }

    /// Whether the file carries a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.metadata.contains_key("tokenizer.chat_template")
    }

    /// The quantisation named by `general.file_type`, when known.
    pub fn quantisation(&self) -> Option<&'static str> {
        let names = [
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_1_SOME_F16",
            "Q4_2",
            "Q4_3",
            "Q8_0",
            "Q5_0",
            "Q5_1",
            "Q2_K",
            "Q3_K_S",
            "Q3_K_M",
            "Q3_K_L",
            "Q4_K_S",
            "Q4_K_M",
            "Q5_K_S",
            "Q5_K_M",
            "Q6_K",
            "IQ2_XXS",
            "IQ2_XS",
            "Q2_K_S",
            "IQ3_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ3_M",
            "IQ2_S",
            "IQ2_M",
            "IQ4_XS",
            "IQ1_M",
            "BF16",
        ];
        names
            .get(usize::try_from(self.uint("general.file_type")?).ok()?)
            .copied()
    }
}

/// Why a file is not a usable GGUF model.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Not a GGUF file, or a damaged header.
    #[error("{path}: not a GGUF model file: {reason}")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What gave it away.
        reason: String,
    },
    /// The header describes more data than the file holds.
    #[error("{path}: truncated: its tensors need {required} bytes but the file has {actual}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes needed.
        required: u64,
        /// Bytes present.
        actual: u64,
    },
}

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// Bytes per block and elements per block of a ggml tensor type, for the
/// types a GGUF model can hold. `None` for types this reader does not know.
fn type_layout(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (4, 1),     // F32
        1 => (2, 1),     // F16
        2 => (18, 32),   // Q4_0
        3 => (20, 32),   // Q4_1
        6 => (22, 32),   // Q5_0
        7 => (24, 32),   // Q5_1
        8 => (34, 32),   // Q8_0
        9 => (36, 32),   // Q8_1
        10 => (84, 256), // Q2_K
        11 => (110, 256),
        12 => (144, 256),
        13 => (176, 256),
        14 => (210, 256),
        15 => (292, 256),
        16 => (66, 256),
        17 => (74, 256),
        18 => (98, 256),
        19 => (50, 256),
        20 => (18, 32),
        21 => (110, 256),
        22 => (82, 256),
        23 => (136, 256),
        24 => (1, 1), // I8
        25 => (2, 1), // I16
        26 => (4, 1), // I32
        27 => (8, 1), // I64
        28 => (8, 1), // F64
        29 => (56, 256),
        30 => (2, 1), // BF16
        34 => (54, 256),
        35 => (66, 256),
        _ => return None,
    })
}

struct Reader<R> {
    inner: R,
}

impl<R: Read + Seek> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf)?;
        Ok(buf)
    }
    fn u32(&mut self) -> io::Result<u32> {
        self.bytes().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> io::Result<u64> {
        self.bytes().map(u64::from_le_bytes)
    }
    fn string(&mut self) -> io::Result<String> {
        let len = self.u64()?;
        if len > 1 << 24 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a {len}-byte string"),
            ));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner.read_exact(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
    fn skip(&mut self, bytes: u64) -> io::Result<()> {
        let bytes = i64::try_from(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "huge skip"))?;
        self.inner.seek_relative(bytes)
    }

    fn value(&mut self, value_type: u32) -> io::Result<GgufValue> {
        Ok(match value_type {
            0 => GgufValue::Uint(u64::from(self.bytes::<1>()?[0])),
            1 => GgufValue::Int(i64::from(self.bytes::<1>()?[0] as i8)),
            2 => GgufValue::Uint(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => GgufValue::Int(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => GgufValue::Uint(u64::from(self.u32()?)),
            5 => GgufValue::Int(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => GgufValue::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => GgufValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                let element_type = self.u32()?;
                let len = self.u64()?;
                match element_type {
                    8 => {
                        for _ in 0..len {
                            let n = self.u64()?;
                            self.skip(n)?;
                        }
                    }
                    t => {
                        let width = scalar_width(t).ok_or_else(|| bad_type(t))?;
                        self.skip(width * len)?;
                    }
                }
                GgufValue::Array { element_type, len }
            }
            10 => GgufValue::Uint(self.u64()?),
            11 => GgufValue::Int(i64::from_le_bytes(self.bytes()?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.bytes()?)),
            t => return Err(bad_type(t)),
        })
    }
}

fn scalar_width(value_type: u32) -> Option<u64> {
    Some(match value_type {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

fn bad_type(value_type: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unknown metadata type {value_type}"),
    )
}

/// Reads and checks a GGUF file's header: magic, version, metadata, tensor
/// table, and that the file is long enough for every tensor.
pub fn read_gguf(path: &Path) -> Result<GgufInfo, GgufError> {
    let io_err = |source| GgufError::Io {
        path: path.to_owned(),
        source,
    };
    let not_gguf = |reason: String| GgufError::NotGguf {
        path: path.to_owned(),
        reason,
    };
    let file = File::open(path).map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if meta.is_dir() {
        return Err(not_gguf("it is a directory".into()));
    }
    let file_size = meta.len();
    let mut r = Reader {
        inner: BufReader::with_capacity(1 << 16, file),
    };
    let eof_as = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            not_gguf(format!("the header ends early (file is {file_size} bytes)"))
        }
        io::ErrorKind::InvalidData => not_gguf(format!("damaged header: {e}")),
        _ => io_err(e),
    };

    let magic: [u8; 4] = r
        .bytes()
        .map_err(|_| not_gguf(format!("only {file_size} bytes long")))?;
    if &magic != MAGIC {
        return Err(not_gguf(format!(
            "it starts with {magic:02x?}, not \"GGUF\""
        )));
    }
    let version = r.u32().map_err(eof_as)?;
    if !(2..=3).contains(&version) {
        return Err(not_gguf(format!("unsupported GGUF version {version}")));
    }
    let tensor_count = r.u64().map_err(eof_as)?;
    let kv_count = r.u64().map_err(eof_as)?;
    if tensor_count > 1 << 24 || kv_count > 1 << 24 {
        return Err(not_gguf(format!(
            "implausible counts ({tensor_count} tensors, {kv_count} keys)"
        )));
    }
    let mut metadata = BTreeMap::new();
    for _ in 0..kv_count {
        let key = r.string().map_err(eof_as)?;
        let value_type = r.u32().map_err(eof_as)?;
        let value = r.value(value_type).map_err(eof_as)?;
        metadata.insert(key, value);
    }
    let mut data_size = 0u64;
    let mut parameters = 0u64;
    let mut matrices = Vec::new();
    for _ in 0..tensor_count {
        let _name = r.string().map_err(eof_as)?;
        let dims = r.u32().map_err(eof_as)?;
        if dims > 8 {
            return Err(not_gguf(format!("a tensor with {dims} dimensions")));
        }
        let mut extents = [1u64; 8];
        for extent in extents.iter_mut().take(dims as usize) {
            *extent = r.u64().map_err(eof_as)?;
        }
        let elements = extents.iter().fold(1u64, |n, &e| n.saturating_mul(e));
        let ggml_type = r.u32().map_err(eof_as)?;
        let stacked = extents[2..].iter().any(|&e| e > 1);
        if extents[1] > 1 || stacked {
            matrices.push(GgufMatrix {
                ggml_type,
                columns: extents[0],
                rows: extents[1],
                stacked,
            });
        }
        let offset = r.u64().map_err(eof_as)?;
        parameters = parameters.saturating_add(elements);
        let bytes = type_layout(ggml_type).map_or(0, |(block_bytes, block_elems)| {
            elements.div_ceil(block_elems).saturating_mul(block_bytes)
        });
        data_size = data_size.max(offset.saturating_add(bytes));
    }
    let alignment = match metadata.get("general.alignment") {
        Some(GgufValue::Uint(a)) if *a > 0 => *a,
        _ => DEFAULT_ALIGNMENT,
    };
    let header_end = r.inner.stream_position().map_err(io_err)?;
    let data_start = header_end.div_ceil(alignment) * alignment;
    let required_size = data_start.saturating_add(data_size);
    if required_size > file_size {
        return Err(GgufError::Truncated {
            path: path.to_owned(),
            required: required_size,
            actual: file_size,
        });
    }
    Ok(GgufInfo {
        version,
        tensor_count,
        metadata,
        parameters,
        required_size,
        file_size,
        matrices,
    })
}
