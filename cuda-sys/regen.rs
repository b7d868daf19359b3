//! Regeneration of `src/generated/*.rs` (only with the `regenerate` feature).
//!
//! Reads `headers.txt`, runs bindgen over each header set found in `CUDA_SYS_INCLUDE`,
//! turns the `extern "C"` block into a `crate::dylib_fns!` invocation (the functions are
//! resolved at run time, never linked) and writes the driver's symbol-version table
//! from `cudaTypedefs.h`. The output depends only on the headers and the bindgen
//! version, so running it twice gives no diff.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

pub fn run() {
    println!("cargo:rerun-if-env-changed=CUDA_SYS_INCLUDE");
    let inc = PathBuf::from(
        std::env::var("CUDA_SYS_INCLUDE")
            .expect("regenerate: set CUDA_SYS_INCLUDE to the CUDA 13.0 include folder"),
    );
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out_dir = manifest.join("src").join("generated");
    fs::create_dir_all(&out_dir).expect("create src/generated");
    let list = fs::read_to_string(manifest.join("headers.txt")).expect("read headers.txt");
    for line in list.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let module = words[0];
        let headers: Vec<&str> = words
            .iter()
            .copied()
            .filter(|w| w.ends_with(".h"))
            .collect();
        let rest: Vec<&str> = words[1..]
            .iter()
            .copied()
            .filter(|w| !w.ends_with(".h"))
            .collect();
        let (fn_prefix, types) = (rest[0], rest[1]);
        let code = generate(&inc, &headers, fn_prefix, types);
        fs::write(out_dir.join(format!("{module}.rs")), code).expect("write generated module");
    }
    let driver = fs::read_to_string(out_dir.join("driver.rs")).expect("read generated driver.rs");
    let table = driver_versions(&inc, &driver);
    fs::write(out_dir.join("driver_versions.rs"), table).expect("write driver_versions.rs");
}

fn generate(inc: &Path, headers: &[&str], fn_prefix: &str, types: &str) -> String {
    let contents: String = headers
        .iter()
        .map(|h| format!("#include <{h}>\n"))
        .collect();
    let bindings = bindgen::Builder::default()
        .header_contents("cuda_sys_wrapper.h", &contents)
        .clang_arg(format!("-I{}", inc.display()))
        // Only this library's API; the types it needs are pulled in recursively.
        .allowlist_function(format!("{fn_prefix}.*"))
        .allowlist_type(types)
        .allowlist_var(types)
        // New-type enums: a value the headers do not know (a newer driver's error code)
        // is still a valid value, never undefined behaviour.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .derive_default(true)
        .derive_eq(true)
        .derive_hash(true)
        .layout_tests(false)
        .generate_comments(false)
        .merge_extern_blocks(true)
        .size_t_is_usize(true)
        .formatter(bindgen::Formatter::Rustfmt)
        .generate()
        .expect("bindgen failed");
    let text = bindings.to_string();
    // The one mechanical rewrite: declarations become a lazily resolved function table.
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        match line.trim_end() {
            "unsafe extern \"C\" {" | "extern \"C\" {" => out.push_str("crate::dylib_fns! {"),
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// `(declared name, base name, CUDA version)` of every driver entry point, so that
/// `cuGetProcAddress(base, version)` returns exactly the ABI the 13.0 headers declare.
///
/// `cudaTypedefs.h` has a `PFN_<base>_v<version>` typedef for every ABI an entry point
/// ever had. A declared name without suffix is the first ABI (`cuCtxSynchronize` is
/// v2000, while `cuCtxSynchronize_v2` is v13000); `<base>_vN` is the N-th, in version
/// order. This holds for every entry point of the 13.0 headers; one that breaks it stops
/// the regeneration.
fn driver_versions(inc: &Path, generated: &str) -> String {
    let mut versions: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for file in ["cudaTypedefs.h", "cudaProfilerTypedefs.h"] {
        let text = fs::read_to_string(inc.join(file)).expect("read typedefs header");
        for line in text.lines() {
            let t = line.trim();
            let Some(start) = t.find("(CUDAAPI *PFN_") else {
                continue;
            };
            let name = &t[start + "(CUDAAPI *PFN_".len()..];
            let Some(end) = name.find(')') else { continue };
            let name = &name[..end];
            if name.ends_with("_ptds") || name.ends_with("_ptsz") {
                continue;
            }
            let Some(pos) = name.rfind("_v") else {
                continue;
            };
            let Ok(version) = name[pos + 2..].parse::<u32>() else {
                continue;
            };
            let list = versions.entry(name[..pos].to_string()).or_default();
            if !list.contains(&version) {
                list.push(version);
            }
        }
    }
    for list in versions.values_mut() {
        list.sort_unstable();
    }
    let block = &generated[generated.find("crate::dylib_fns!").expect("function block")..];
    let mut rows: BTreeMap<String, (String, u32)> = BTreeMap::new();
    for line in block.lines() {
        let Some(rest) = line.trim().strip_prefix("pub fn ") else {
            continue;
        };
        let Some(name) = rest.split('(').next() else {
            continue;
        };
        let (base, nth) = match name.rfind("_v") {
            Some(i)
                if versions.contains_key(&name[..i]) && name[i + 2..].parse::<usize>().is_ok() =>
            {
                (&name[..i], name[i + 2..].parse::<usize>().expect("checked"))
            }
            _ => (name, 1),
        };
        let list = versions
            .get(base)
            .unwrap_or_else(|| panic!("no PFN typedef for driver entry point {name}"));
        let version = *list
            .get(nth - 1)
            .unwrap_or_else(|| panic!("{name}: ABI {nth} but only {} typedefs", list.len()));
        rows.insert(name.to_string(), (base.to_string(), version));
    }
    let mut out = String::from(
        "// Generated by cuda-sys/regen.rs from cudaTypedefs.h; do not edit.\n\
         /// (declared entry point, name for cuGetProcAddress, CUDA version of its ABI), sorted.\n\
         pub(crate) static DRIVER_SYMBOL_VERSIONS: &[(&str, &str, u32)] = &[\n",
    );
    for (name, (base, version)) in rows {
        out.push_str(&format!("    (\"{name}\", \"{base}\", {version}),\n"));
    }
    out.push_str("];\n");
    out
}
