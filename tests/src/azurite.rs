//! Azurite, Azure Storage's emulator, on loopback for the object-store
//! tests' `az://` URLs (`scripts/azurite.sh` installs it; `scripts/test.sh`
//! passes it as `CORTEX_TEST_AZURITE`), over a temporary folder, killed on
//! drop.

use std::path::Path;
use std::process::{Child, Command};

use crate::s3::start_listening;
use crate::{Cortex, python_check, service_program};

/// A running Azurite blob server.
pub struct AzuriteServer {
    child: Child,
    _root: tempfile::TempDir,
    port: u16,
}

impl AzuriteServer {
    /// Starts one; `None`, after saying so, when none was given and none is
    /// required (`CORTEX_REQUIRE_AZURITE=1`).
    pub fn start() -> Option<Self> {
        let binary = service_program(
            "Azurite",
            "CORTEX_TEST_AZURITE",
            "CORTEX_REQUIRE_AZURITE",
            "bash scripts/azurite.sh installs it",
        )?;
        let root = tempfile::tempdir().expect("a temp dir");
        let (child, port) = start_listening("Azurite", |port| {
            let mut command = Command::new(&binary);
            command
                .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                .arg("--location")
                .arg(root.path())
                .args(["--silent", "--skipApiVersionCheck"]);
            command
        });
        Some(Self {
            child,
            _root: root,
            port,
        })
    }

    /// The blob endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Points an installation's commands at this emulator (its well-known
    /// development account).
    pub fn configure(&self, cortex: &mut Cortex) {
        cortex.set_env("AZURE_STORAGE_USE_EMULATOR", "true");
        cortex.set_env("AZURITE_BLOB_STORAGE_URL", &self.endpoint());
    }

    /// Runs `tests/python/azure_blobs.py` (azure-storage-blob) against it.
    pub fn blobs(&self, args: &[&str]) -> String {
        let endpoint = self.endpoint();
        let mut all = vec!["--endpoint", &endpoint];
        all.extend_from_slice(args);
        let paths: Vec<&Path> = all.iter().map(Path::new).collect();
        python_check("azure_blobs.py", &paths)
    }
}

impl Drop for AzuriteServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
