//! Compiles `csrc/nvtx.c`, cuda-rt's NVTX shim, against the vendored NVTX v3 headers.
//! Needs only a C compiler: no CUDA toolkit, no GPU.

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    // cuda-rt is for Linux: elsewhere the crates stop with one `compile_error!` (see
    // the crate roots), which a C compiler's failure here must not bury.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    cc::Build::new()
        .file("csrc/nvtx.c")
        .include("csrc")
        .warnings(true)
        .compile("cuda_rt_nvtx");
    // NVTX v3 opens the tool with dlopen; glibc before 2.34 keeps it in libdl.
    println!("cargo:rustc-link-lib=dl");
}
