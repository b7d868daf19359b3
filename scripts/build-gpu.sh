#!/usr/bin/env bash
# Builds every test and bench binary (profile `gpu`: optimised, no debug info,
# stripped), the C shim, the C smoke program, the examples and the Python wheel
# (gpu-bin/wheel/, around the same shim) into gpu-bin/, with the runner gpu-bin/run.sh.
# Send gpu-bin/ to the GPU machine and run `bash gpu-bin/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=gpu-bin
rm -rf "$OUT"
mkdir -p "$OUT/tests" "$OUT/benches" "$OUT/examples" "$OUT/lib" "$OUT/wheel"

# Binaries are named after the library a package builds (`cuda_rt__test__pool`), not
# the package (`cuda-rt-safe` on crates.io): run.sh's ONLY/SKIP filters and the notes
# name them so. A package without a library (the CLI) goes by its name.
LIB_NAMES=$(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
names = {}
for p in json.load(sys.stdin)["packages"]:
    libs = [t["name"] for t in p["targets"] if "lib" in t["kind"] or "cdylib" in t["kind"] or "rlib" in t["kind"]]
    names[p["name"]] = libs[0] if libs else p["name"].replace("-", "_")
print(json.dumps(names))')
export LIB_NAMES

collect() { # $1 = folder under $OUT, $2 = what to keep (test|bench|example), rest = cargo args
  local dest=$1 keep=$2; shift 2
  cargo "$@" --workspace --profile gpu --message-format=json 2>/dev/null |
    python3 -c '
import json, os, shutil, sys
dest, keep = sys.argv[1], sys.argv[2]
lib_names = json.loads(os.environ["LIB_NAMES"])
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind = m["target"]["kind"][0]
    if keep == "test" and not (m["profile"]["test"] and kind != "bench"):
        continue
    if keep != "test" and kind != keep:
        continue
    # The compile-fail tests run cargo itself: CPU only, they run in CI.
    if m["target"]["name"] == "compile_fail":
        continue
    # The package id ends in #name@version, or in #version when the name is the folder name.
    pkg = m["package_id"].split("#")[-1]
    pkg = pkg.split("@")[0] if "@" in pkg else os.path.basename(os.path.dirname(m["manifest_path"]))
    pkg = lib_names.get(pkg, pkg.replace("-", "_"))
    name = "%s__%s__%s" % (pkg, "unit" if kind in ("lib", "cdylib", "rlib") else kind, m["target"]["name"])
    shutil.copy2(m["executable"], os.path.join(dest, name))
    print("  " + name)
' "$OUT/$dest" "$keep"
}

echo "tests:";    collect tests test test --no-run
# NO_BENCH=1 leaves the bench binaries out (the tree that travels must stay under 64 MiB).
if [ "${NO_BENCH:-0}" != 1 ]; then
  echo "benches:";  collect benches bench bench --no-run
fi
echo "examples:"; collect examples example build --examples
cargo build -p cuda-rt-c --profile gpu
# The `cuda-rt` command (run.sh runs `cuda-rt info`, and `cuda-rt bench` with BENCH=1;
# its tests find it through CUDA_RT_CLI).
cargo build -p cuda-rt-cli --profile gpu
# Where cargo builds (CARGO_TARGET_DIR or the workspace's target/).
target_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
cp "$target_dir/gpu/libcuda_rt_c.so" "$OUT/lib/"
cp "$target_dir/gpu/cuda-rt" "$OUT/cuda-rt"
# The wheel around that shim (no second cargo build): run.sh installs it in a virtual
# environment on the GPU machine, which has no network and needs none (the wheel has
# no dependencies, and nothing is built at install time).
CUDA_RT_WHEEL_LIB="$PWD/$OUT/lib/libcuda_rt_c.so" python3 -m pip wheel --quiet \
  --disable-pip-version-check --no-deps ./python -w "$OUT/wheel"
rm -rf python/build python/*.egg-info
ls "$OUT"/wheel/*.whl
# The programs linked with -lcuda_rt_c ask the loader for the soname, libcuda_rt_c.so.0.
ln -sf libcuda_rt_c.so "$OUT/lib/libcuda_rt_c.so.0"
# As tests/c_shim.rs compiles them: strict C99.
CFLAGS_C99="-std=c99 -pedantic -Wall -Wextra -Werror"
${CC:-cc} $CFLAGS_C99 tests/c/smoke.c -I. -L"$OUT/lib" -lcuda_rt_c -Wl,-rpath,'$ORIGIN/lib' -o "$OUT/c_smoke"
${CC:-cc} $CFLAGS_C99 tests/c/api.c -I. -L"$OUT/lib" -lcuda_rt_c -Wl,-rpath,'$ORIGIN/lib' -o "$OUT/c_api"
# The C example runs with the Rust examples (from gpu-bin/examples, so its rpath
# climbs one folder).
${CC:-cc} $CFLAGS_C99 examples/c/saxpy.c -I. -L"$OUT/lib" -lcuda_rt_c -Wl,-rpath,'$ORIGIN/../lib' -o "$OUT/examples/c_saxpy"
${CC:-cc} $CFLAGS_C99 tests/c/teardown.c -I. -pthread -L"$OUT/lib" -lcuda_rt_c -Wl,-rpath,'$ORIGIN/lib' -o "$OUT/c_teardown"
cp scripts/gpu-run.sh "$OUT/run.sh"
du -sh "$OUT"
size=$(du -sb "$OUT" | cut -f1)
if [ "$size" -gt $((64 * 1024 * 1024)) ]; then
  echo "gpu-bin is $size bytes: over the 64 MiB that can travel" >&2
  exit 1
fi
