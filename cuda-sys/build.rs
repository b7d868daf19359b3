//! Build script of cuda-sys.
//!
//! The default build does nothing: the bindings under `src/generated/` are committed.
//! With the `regenerate` feature (see `scripts/regen-bindings.sh`) it runs bindgen over
//! the CUDA 13.0 headers found in `CUDA_SYS_INCLUDE` and rewrites those files.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "regenerate")]
    regen::run();
}

#[cfg(feature = "regenerate")]
#[path = "regen.rs"]
mod regen;
