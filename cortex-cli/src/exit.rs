//! The errors that choose the process's exit code (`EXIT_CODES`), apart from
//! the commands so that any module may return one.

/// An error that is its message, told apart by its type for the exit code.
macro_rules! message_error {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub(crate) struct $name(pub(crate) String);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::error::Error for $name {}
    };
}

message_error!(
    /// An input the command cannot take (exit code 3, as for bad lines).
    BadInput
);
message_error!(
    /// A job asked for that is not there, or none when the newest was asked
    /// for (exit code 4, as for a job id that does not exist).
    NoJob
);
message_error!(
    /// A command line whose parts do not go together (exit code 2, as
    /// clap's own usage errors), found once the command looks at what it names.
    Usage
);

/// How a job that ended with requests not completed exits (see `EXIT_CODES`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Exit {
    /// Some requests completed, some did not: 6.
    SomeFailed = 6,
    /// No request completed: 7.
    NothingCompleted = 7,
}

/// A job ended, with requests that did not complete: its results are
/// written, and the exit code says it was not a full success.
#[derive(Debug)]
pub(crate) struct Unfinished {
    pub(crate) exit: Exit,
    pub(crate) message: String,
}

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Unfinished {}
