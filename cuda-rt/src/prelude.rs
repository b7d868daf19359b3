//! The traits that give streams their methods, for one glob import:
//!
//! ```
//! use cuda_rt::prelude::*;
//! ```
//!
//! A stream's operations are on [`AsStream`] (synchronize, query, host functions,
//! making it current) and on traits defined above it by the modules whose types they
//! take: [`StreamEventExt`] (record, wait for an event) and [`StreamCaptureExt`]
//! (capture into a graph). All are implemented for every
//! stream type.

pub use crate::event::StreamEventExt;
pub use crate::graph::StreamCaptureExt;
pub use crate::stream::AsStream;
