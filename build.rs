//! Build script of the C shim: gives the shared library a soname so C programs can
//! link it by name. Nothing here needs CUDA.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda_rt_c.so");
    }
}
