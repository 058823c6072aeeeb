//! Where cortex jobs read from and write to: a local path, or an object in
//! a store (`s3://bucket/key` on AWS or any S3-compatible store through the
//! standard `AWS_*` variables, `AWS_ENDPOINT_URL` included; `gs://` and
//! `az://` through `GOOGLE_*` and `AZURE_*`; `https://`, read only;
//! `file://` is a local path), through Apache Arrow's `object_store`.
//!
//! [`Location::parse`] tells the two apart. An object is opened
//! ([`ObjectLocation::open`]) with its size and ETag, then read in ranges
//! ([`RemoteObject::read_range`], random access for Parquet) or as a stream
//! ([`ObjectReader`], 8 MiB ranges, the next fetched while this one is
//! read): a 10 GB input never sits in memory, and every range asks for the
//! version first seen (`If-Match` on its ETag), so an object replaced while
//! it is read fails with [`changed`](ObjectError::Changed) instead of giving
//! a mix of two versions. [`ObjectWriter`] writes one as a multipart upload
//! that becomes visible only when [`ObjectWriter::finish`] completes it:
//! a reader never sees half an object, and a process killed while writing
//! leaves none.
//!
//! ```
//! use cortex_objects::Location;
//!
//! // A path stays a path; a URL names an object (its store is built when
//! // first used, from the environment's credentials).
//! let local = Location::parse("results/out.jsonl")?;
//! assert_eq!(local.local(), Some(std::path::Path::new("results/out.jsonl")));
//! let object = Location::parse("s3://bucket/jobs/in.parquet")?;
//! assert_eq!(object.file_name().as_deref(), Some("in.parquet"));
//! assert_eq!(object.with_file_name("out.jsonl").file_name().as_deref(), Some("out.jsonl"));
//! assert!(Location::parse("ftp://host/file").is_err());
//! # Ok::<(), cortex_objects::ObjectError>(())
//! ```
//!
//! # Design notes
//!
//! `object_store` is async; cortex's workers are threads. A private tokio
//! runtime (two threads, started on first use) drives it, and every call
//! here blocks the calling thread: never call them from async code. Retries
//! are bounded (3, within 30 s; connections time out after 5 s), so an
//! unreachable store is an error in seconds, not minutes.

#![forbid(unsafe_code)]

mod error;
mod location;
mod read;
mod runtime;
mod write;

pub use error::ObjectError;
pub use location::{Location, ObjectLocation};
pub use read::{ObjectReader, RemoteObject};
pub use write::{ObjectWriter, PART_SIZE};
