//! The private runtime that drives `object_store` for blocking callers.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

pub(crate) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cortex-objects")
            .enable_all()
            .build()
            .expect("cannot start the object store's runtime")
    })
}

/// Runs `future` to its end on the calling thread (not inside a runtime).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    runtime().block_on(future)
}
