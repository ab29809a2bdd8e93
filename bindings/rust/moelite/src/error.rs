//! Errors: every fallible call returns the C API's status together with the library's message
//! for it (moelite_last_error, read on the same thread right after the call).
use std::ffi::CStr;
use std::fmt;

use moelite_sys as sys;

/// A `moelite_status` value. The constants name the ones callers commonly match on; any value the
/// library returns is kept as is (`name()` gives its constant's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub i32);

impl Status {
    pub const OK: Status = Status(sys::MOELITE_OK);
    pub const INVALID_ARGUMENT: Status = Status(sys::MOELITE_ERR_INVALID_ARGUMENT);
    pub const OUT_OF_MEMORY: Status = Status(sys::MOELITE_ERR_OUT_OF_MEMORY);
    pub const FILE_NOT_FOUND: Status = Status(sys::MOELITE_ERR_FILE_NOT_FOUND);
    pub const IO: Status = Status(sys::MOELITE_ERR_IO);
    pub const BUFFER_TOO_SMALL: Status = Status(sys::MOELITE_ERR_BUFFER_TOO_SMALL);
    pub const GGUF_BAD_MAGIC: Status = Status(sys::MOELITE_ERR_GGUF_BAD_MAGIC);
    pub const UNSUPPORTED_ARCH: Status = Status(sys::MOELITE_ERR_UNSUPPORTED_ARCH);
    pub const UNSUPPORTED_TYPE: Status = Status(sys::MOELITE_ERR_UNSUPPORTED_TYPE);
    pub const BACKEND_UNAVAILABLE: Status = Status(sys::MOELITE_ERR_BACKEND_UNAVAILABLE);
    pub const BUDGET_TOO_SMALL: Status = Status(sys::MOELITE_ERR_BUDGET_TOO_SMALL);
    pub const NOT_IMPLEMENTED: Status = Status(sys::MOELITE_ERR_NOT_IMPLEMENTED);
    pub const BAD_PROFILE: Status = Status(sys::MOELITE_ERR_BAD_PROFILE);
    pub const CONTEXT_FULL: Status = Status(sys::MOELITE_ERR_CONTEXT_FULL);
    pub const BAD_TOKEN: Status = Status(sys::MOELITE_ERR_BAD_TOKEN);
    pub const ABORTED: Status = Status(sys::MOELITE_ERR_ABORTED);
    pub const PROGRESS_ABORTED: Status = Status(sys::MOELITE_ERR_PROGRESS_ABORTED);
    /// Another thread is inside a call on the context. Safe code cannot cause it (a `Context` is
    /// `Send`, not `Sync`, and changes through `&mut self`); it comes from raw `sys` calls.
    pub const BUSY: Status = Status(sys::MOELITE_ERR_BUSY);
    pub const BAD_SESSION: Status = Status(sys::MOELITE_ERR_BAD_SESSION);
    pub const SESSION_MISMATCH: Status = Status(sys::MOELITE_ERR_SESSION_MISMATCH);
    pub const INTERNAL: Status = Status(sys::MOELITE_ERR_INTERNAL);

    /// The constant's name, e.g. "MOELITE_ERR_IO" ("MOELITE_ERR_UNKNOWN" for other values).
    pub fn name(self) -> &'static str {
        // Static storage in the library, never NULL.
        unsafe { CStr::from_ptr(sys::moelite_status_name(self.0)) }.to_str().unwrap_or("MOELITE_ERR_UNKNOWN")
    }
}

/// A failed call: its status and the library's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    /// The error of a call that just returned `status` on this thread.
    pub(crate) fn last(status: sys::moelite_status) -> Error {
        let message = unsafe { CStr::from_ptr(sys::moelite_last_error()) }.to_string_lossy().into_owned();
        Error { status: Status(status), message }
    }

    /// An error found on the Rust side before calling the library (e.g. a NUL byte in a path).
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error { status: Status::INVALID_ARGUMENT, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Ok for MOELITE_OK, else the call's error.
pub(crate) fn check(status: sys::moelite_status) -> Result<()> {
    if status == sys::MOELITE_OK {
        Ok(())
    } else {
        Err(Error::last(status))
    }
}

/// A slice's length as the `int32_t` count the C API takes: `len as i32` would keep the low 32
/// bits, so 2^32 + 1 ids would pass as one.
pub(crate) fn c_count(what: &str, len: usize) -> Result<i32> {
    i32::try_from(len).map_err(|_| Error::invalid(format!("{what}: {len} items do not fit an int32_t count")))
}

pub(crate) fn c_string(what: &str, s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))
}
