//! The `nvcc` backend ([`Backend::Nvcc`](super::Backend::Nvcc), CuPy's
//! `backend='nvcc'`): the toolkit's offline compiler run on the program in a private
//! temporary folder, for code NVRTC cannot take (host-side templates in headers, a
//! specific `nvcc` flag) or to match a build made with `nvcc`.
//!
//! `nvcc` is found as: `CUDA_RT_NVCC` (its file), then `bin/nvcc` under `CUDA_PATH`,
//! `CUDA_HOME` and `/usr/local/cuda`, then `PATH`. The program's options go to `nvcc`
//! as they are, then `--cubin` or `--ptx` and the target's `-arch` (unless the options
//! have one). Name expressions need NVRTC (`nvcc` does not lower them): they are
//! refused here. A failed compile is an [`Error::Compile`] with `nvcc`'s output as
//! the log; the toolkit's include folders are `nvcc`'s own.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Compiled, Output, Program, Target};
use crate::error::{ArgumentKind, CompileError, Error, Result, UnsupportedKind};

/// The variable naming the `nvcc` to run.
pub const NVCC_VAR: &str = "CUDA_RT_NVCC";

/// Where `nvcc` is looked for, in order (see the module docs), with `env` reading
/// variables. Pure but for the file checks.
pub fn find_nvcc_with(
    env: impl Fn(&str) -> Option<String>,
) -> std::result::Result<PathBuf, Vec<PathBuf>> {
    let mut tried = Vec::new();
    if let Some(p) = env(NVCC_VAR).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    let mut roots: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(|k| env(k).filter(|v| !v.is_empty()).map(PathBuf::from))
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    for r in roots {
        let p = r.join("bin").join("nvcc");
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    for dir in std::env::split_paths(&env("PATH").unwrap_or_default()) {
        let p = dir.join("nvcc");
        if p.is_file() {
            return Ok(p);
        }
    }
    tried.push(PathBuf::from("nvcc on PATH"));
    Err(tried)
}

/// The `nvcc` of this process's environment.
pub fn find_nvcc() -> Result<PathBuf> {
    find_nvcc_with(|k| std::env::var(k).ok()).map_err(|tried| {
        Error::not_supported(
            UnsupportedKind::Other,
            format!(
                "the nvcc backend needs the CUDA toolkit's nvcc, which was not found (tried {}); \
                 install the toolkit, set {NVCC_VAR}, or use the NVRTC backend",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// What identifies the `nvcc` at `path` for the kernel cache: its path, size and
/// modification time (a reinstalled toolkit changes them).
pub fn nvcc_identity(path: &Path) -> Vec<u8> {
    let mut out = path.as_os_str().as_encoded_bytes().to_vec();
    if let Ok(m) = std::fs::metadata(path) {
        out.extend_from_slice(&m.len().to_le_bytes());
        if let Ok(t) = m.modified().and_then(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_err(std::io::Error::other)
        }) {
            out.extend_from_slice(&t.as_nanos().to_le_bytes());
        }
    }
    out
}

/// The arguments `nvcc` gets for `program` and `target` (source and output paths
/// last). Pure.
pub fn nvcc_args(
    program: &Program<'_>,
    target: Target,
    source: &Path,
    output: &Path,
) -> Vec<String> {
    let mut args: Vec<String> = program.options.iter().map(|s| (*s).to_owned()).collect();
    args.push(
        match target.output {
            Output::Cubin => "--cubin",
            Output::Ptx => "--ptx",
        }
        .to_owned(),
    );
    let has_arch = program.options.iter().any(|o| {
        o.starts_with("-arch") || o.starts_with("--gpu-architecture") || o.starts_with("-gencode")
    });
    if !has_arch {
        args.push(target.arch_option());
    }
    args.push("-o".to_owned());
    args.push(output.display().to_string());
    args.push(source.display().to_string());
    args
}

/// Compiles `program` for `target` with `nvcc` (see the module docs).
pub fn compile(program: &Program<'_>, target: Target) -> Result<Compiled> {
    if !program.name_expressions.is_empty() {
        return Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            "name expressions need the NVRTC backend: nvcc does not lower them",
        ));
    }
    compile_with(&find_nvcc()?, program, target)
}

/// [`compile`] with the `nvcc` at `nvcc`.
fn compile_with(nvcc: &Path, program: &Program<'_>, target: Target) -> Result<Compiled> {
    let dir = private_dir()?;
    let name = Path::new(program.source_name)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .unwrap_or_else(|| "kernel.cu".to_owned());
    let source = dir.path.join(name);
    let output = dir.path.join(match target.output {
        Output::Cubin => "out.cubin",
        Output::Ptx => "out.ptx",
    });
    std::fs::write(&source, program.source).map_err(|e| io("writing the source", e))?;
    let run = Command::new(nvcc)
        .args(nvcc_args(program, target, &source, &output))
        .current_dir(&dir.path)
        .output()
        .map_err(|e| io(&format!("running {}", nvcc.display()), e))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    if !run.status.success() {
        return Err(Error::Compile(CompileError {
            call: "nvcc",
            code: run.status.code().unwrap_or(-1),
            name: format!("nvcc exited with {}", run.status),
            source_name: Some(program.source_name.to_owned()),
            log,
        }));
    }
    let mut image = std::fs::read(&output).map_err(|e| io("reading nvcc's output", e))?;
    if target.output == Output::Ptx && image.last() != Some(&0) {
        image.push(0); // PTX images are NUL-terminated, as NVRTC's are
    }
    Ok(Compiled {
        image,
        output: target.output,
        arch: target.arch,
        log,
        lowered_names: Vec::new(),
    })
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::invalid_state(
        crate::error::StateKind::Other,
        format!("nvcc backend: {what}: {e}"),
    )
}

/// A folder of this process's own under the temporary folder, removed on drop.
struct PrivateDir {
    path: PathBuf,
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn private_dir() -> Result<PrivateDir> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "cuda-rt-nvcc-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&path).map_err(|e| io("making a temporary folder", e))?;
    Ok(PrivateDir { path })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in for nvcc: writes its arguments to the `-o` file, or fails with a
    /// message when the source contains `error`.
    fn fake_nvcc(dir: &Path) -> PathBuf {
        let p = dir.join("nvcc");
        std::fs::write(
            &p,
            "#!/bin/sh\nout=\"\"; prev=\"\"; src=\"\"\n\
             for a in \"$@\"; do [ \"$prev\" = \"-o\" ] && out=\"$a\"; prev=\"$a\"; src=\"$a\"; done\n\
             if grep -q error \"$src\"; then echo \"$src(1): error: bad\" >&2; exit 2; fi\n\
             echo warning-free\n\
             printf '%s ' \"$@\" > \"$out\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn temp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("cuda-rt-nvcc-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn nvcc_is_found_by_variable_then_toolkit_folders_then_path() {
        let d = temp("find");
        let nvcc = fake_nvcc(&d);
        let var = nvcc.display().to_string();
        let got = find_nvcc_with(|k| (k == NVCC_VAR).then(|| var.clone()));
        assert_eq!(got.unwrap(), nvcc);
        std::fs::create_dir_all(d.join("tk/bin")).unwrap();
        std::fs::copy(&nvcc, d.join("tk/bin/nvcc")).unwrap();
        let root = d.join("tk").display().to_string();
        let got = find_nvcc_with(|k| (k == "CUDA_HOME").then(|| root.clone()));
        assert_eq!(got.unwrap(), d.join("tk/bin/nvcc"));
        let dir = d.display().to_string();
        let got = find_nvcc_with(|k| (k == "PATH").then(|| dir.clone()));
        if !Path::new("/usr/local/cuda/bin/nvcc").is_file() {
            assert_eq!(got.unwrap(), nvcc);
            let none = find_nvcc_with(|_| None).unwrap_err();
            assert!(none.iter().any(|p| p.ends_with("bin/nvcc")), "{none:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn nvcc_gets_the_options_the_output_kind_and_the_arch() {
        let p = Program::new("__global__ void k() {}").options(&["-O3", "-std=c++17"]);
        let a = nvcc_args(
            &p,
            Target::cubin(90),
            Path::new("/t/k.cu"),
            Path::new("/t/o"),
        );
        assert_eq!(
            a,
            [
                "-O3",
                "-std=c++17",
                "--cubin",
                "-arch=sm_90",
                "-o",
                "/t/o",
                "/t/k.cu"
            ]
        );
        let p = Program::new("").options(&["-arch=sm_80"]);
        let a = nvcc_args(&p, Target::ptx(90), Path::new("k.cu"), Path::new("o"));
        assert_eq!(a, ["-arch=sm_80", "--ptx", "-o", "o", "k.cu"]);
    }

    #[test]
    fn a_compile_runs_nvcc_and_a_failure_carries_its_output() {
        let d = temp("compile");
        let nvcc = fake_nvcc(&d);
        let p = Program::new("__global__ void k() {}")
            .source_name("saxpy.cu")
            .backend(super::super::Backend::Nvcc);
        let c = compile_with(&nvcc, &p, Target::ptx(90)).unwrap();
        let text = String::from_utf8_lossy(&c.image);
        assert!(text.starts_with("--ptx -arch=compute_90 -o "), "{text}");
        assert!(text.contains("saxpy.cu"), "{text}");
        assert_eq!(c.image.last(), Some(&0), "PTX is NUL-terminated");
        assert_eq!(c.log.trim(), "warning-free");
        let bad = Program::new("an error here").backend(super::super::Backend::Nvcc);
        let e = compile_with(&nvcc, &bad, Target::cubin(90)).unwrap_err();
        match e {
            Error::Compile(c) => {
                assert_eq!(c.call, "nvcc");
                assert!(c.log.contains("error: bad"), "{}", c.log);
            }
            other => panic!("{other}"),
        }
        let named = Program::new("").name_expressions(&["k<int>"]);
        assert!(compile(
            &named.backend(super::super::Backend::Nvcc),
            Target::cubin(90)
        )
        .is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
