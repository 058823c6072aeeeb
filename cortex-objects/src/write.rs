//! Writing an object whole or not at all: a multipart upload completed at
//! the end.

use std::io::{self, Write};

use object_store::{ObjectStoreExt, WriteMultipart};

use crate::runtime::{block_on, runtime};
use crate::{ObjectError, ObjectLocation};

/// The size of each uploaded part (S3 takes 5 MiB at least, but for the last).
pub const PART_SIZE: usize = 8 << 20;

/// Parts in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// An object being written ([`Write`]): nothing is visible at its URL until
/// [`ObjectWriter::finish`]; dropped unfinished, the upload is abandoned.
pub struct ObjectWriter {
    url: String,
    upload: Option<WriteMultipart>,
}

impl ObjectLocation {
    /// Starts writing the object (a multipart upload; `https://` refuses).
    pub fn create(&self) -> Result<ObjectWriter, ObjectError> {
        self.check_writable()?;
        let upload = block_on(self.store.put_multipart(&self.path))
            .map_err(|e| self.explain(ObjectError::from_store(self.url(), None, e)))?;
        Ok(ObjectWriter {
            url: self.url().to_owned(),
            upload: Some(WriteMultipart::new_with_chunk_size(upload, PART_SIZE)),
        })
    }
}

impl ObjectWriter {
    fn fail(&self, error: object_store::Error) -> io::Error {
        ObjectError::from_store(&self.url, None, error).into()
    }

    /// Completes the upload: the object appears, whole.
    pub fn finish(mut self) -> Result<(), ObjectError> {
        let upload = self.upload.take().expect("finished once");
        block_on(upload.finish())
            .map(drop)
            .map_err(|e| ObjectError::from_store(&self.url, None, e))
    }
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(upload) = self.upload.as_mut() else {
            return Err(io::Error::other("the upload has ended"));
        };
        // A full part is handed to a task on the runtime.
        let _entered = runtime().enter();
        upload.write(buf);
        let waited = block_on(upload.wait_for_capacity(PARTS_IN_FLIGHT));
        waited.map_err(|e| self.fail(e))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            // Best effort: a store keeps an abandoned upload's parts
            // invisible either way (S3 until a lifecycle rule removes them).
            let _ = block_on(upload.abort());
        }
    }
}
