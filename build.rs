//! Build script of the C shim: gives the shared library a versioned soname,
//! `libcuda_rt_c.so.0`, so that a program linked with `-lcuda_rt_c` records the ABI it
//! was built for and a later, incompatible library (`.so.1`) can sit beside it. The
//! number is the C ABI's version, raised on an incompatible change to `wrapper.h`.
//! Cargo writes the file as `libcuda_rt_c.so`: the loader finds it under the soname
//! through a `libcuda_rt_c.so.0` link beside it (the README's C section,
//! `scripts/build-gpu.sh`). Nothing here needs CUDA.

/// The C ABI's version: the number in the soname.
const ABI_VERSION: u32 = 0;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda_rt_c.so.{ABI_VERSION}");
    }
}
