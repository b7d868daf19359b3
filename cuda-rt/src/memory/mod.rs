//! Device memory: allocation and pools.

pub mod arena;
