//! The C ABI over cuda-rt: opaque handles, integer error codes and a thread-local
//! last-error message. Declared for C in `wrapper.h`.
//!
//! Every function returns `CURT_SUCCESS` (0) or an error code and never unwinds: a
//! panic inside is caught and reported as `CURT_ERROR_PANIC`. On error,
//! `curt_last_error()` returns the message until the next failing call on the thread.
//! Both hold from thread-local and `pthread_key_create` destructors and from `atexit`
//! handlers too: once the thread's storage is torn down, calls still return their
//! codes and `curt_last_error()` returns `""`.

#![warn(missing_docs)]

mod ffi;

pub use ffi::*;
