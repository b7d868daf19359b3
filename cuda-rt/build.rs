//! Compiles `csrc/nvtx.c`, cuda-rt's NVTX shim, against the vendored NVTX v3 headers.
//! Needs only a C compiler: no CUDA toolkit, no GPU.

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    cc::Build::new()
        .file("csrc/nvtx.c")
        .include("csrc")
        .warnings(true)
        .compile("cuda_rt_nvtx");
    // NVTX v3 opens the tool with dlopen; glibc before 2.34 keeps it in libdl.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-lib=dl");
    }
}
