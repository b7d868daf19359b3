//! Device memory: allocation and pools.
