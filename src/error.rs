//! The crate's one error type.

use std::fmt;

/// Everything that can go wrong in trmask.
///
/// [`Error::is_user_error`] tells bad input or usage (CLI exit code 2) from
/// failures of the machine (exit code 1).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A tensor of the batch is missing, malformed or inconsistent. `tensor` names it.
    InvalidInput { tensor: String, problem: String },
    /// A configuration key or value makes no sense. `key` names it.
    InvalidConfig { key: String, problem: String },
    /// A file could not be read or written, or is truncated / not in the expected format.
    File { path: String, problem: String },
    /// Reading or writing a file failed for a reason of the machine, not of the input: disk
    /// full, file-size limit, quota, I/O error, a file changed while being read (CLI exit code
    /// 1). See [`Error::io`].
    Io { path: String, problem: String },
    /// No GPU adapter could be found or opened.
    NoAdapter(String),
    /// The GPU reported an error (device lost, out of memory, validation).
    Gpu(String),
    /// A WGSL shader failed to compile; `kernel` names the variant.
    ShaderCompile { kernel: String, message: String },
    /// The input (or a kernel) needs more than a device limit allows: `what` says what needs
    /// how much, `limit` is the device's value (bytes, workgroups, …) it exceeds.
    Limit { what: String, limit: u64 },
    /// The device (or the host) ran out of memory for a request the limits allow: `what` says
    /// which. Not the input's fault (CLI exit code 1): a smaller chunk or another device helps.
    OutOfMemory(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn input(tensor: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::InvalidInput {
            tensor: tensor.into(),
            problem: problem.into(),
        }
    }
    /// Shorthand for [`Error::InvalidConfig`].
    pub fn config(key: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::InvalidConfig {
            key: key.into(),
            problem: problem.into(),
        }
    }
    /// Shorthand for [`Error::File`].
    pub fn file(path: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::File {
            path: path.into(),
            problem: problem.into(),
        }
    }
    /// The error of a failed read or write of `path`: [`Error::Io`] when the machine is at
    /// fault (disk full, file-size limit, quota exceeded, I/O error), else [`Error::File`]
    /// (missing file, permission denied, not a directory, …).
    pub fn io(path: impl Into<String>, e: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let machine = matches!(
            e.kind(),
            K::StorageFull | K::FileTooLarge | K::QuotaExceeded | K::OutOfMemory
        ) || e.raw_os_error() == Some(5); // EIO
        if machine {
            Error::Io {
                path: path.into(),
                problem: e.to_string(),
            }
        } else {
            Error::file(path, e.to_string())
        }
    }
    /// Shorthand for [`Error::Limit`].
    pub fn limit(what: impl Into<String>, limit: u64) -> Self {
        Error::Limit {
            what: what.into(),
            limit,
        }
    }
    /// True for errors caused by the caller's input or configuration (CLI exit code 2),
    /// including inputs too large for the device ([`Error::Limit`]).
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Error::InvalidInput { .. }
                | Error::InvalidConfig { .. }
                | Error::File { .. }
                | Error::Limit { .. }
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidInput { tensor, problem } => {
                write!(f, "invalid input `{tensor}`: {problem}")
            }
            Error::InvalidConfig { key, problem } => write!(f, "invalid config `{key}`: {problem}"),
            Error::File { path, problem } | Error::Io { path, problem } => {
                write!(f, "{path}: {problem}")
            }
            Error::NoAdapter(m) => write!(f, "no GPU adapter: {m}"),
            Error::Gpu(m) => write!(f, "GPU error: {m}"),
            Error::ShaderCompile { kernel, message } => {
                write!(f, "shader `{kernel}` failed to compile: {message}")
            }
            Error::Limit { what, limit } => {
                write!(f, "{what}: over the device limit of {limit}")
            }
            Error::OutOfMemory(m) => write!(f, "out of memory: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// The crate's result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
