"""Builds the ``cuda-rt-alloc`` wheel: ``cuda_rt_alloc.py`` as the package
``cuda_rt_alloc`` with the C shim ``libcuda_rt_c.so`` beside it, where the module
looks first (after ``CUDA_RT_C_LIB``). Nothing is compiled for Python: the library
is loaded with ctypes, so one wheel serves every Python 3 (tag ``py3-none-<platform>``).

The shim is built by cargo from the repository this folder belongs to (``cargo build
--release --lib`` of the root package, which builds the cdylib), or taken ready-made
from ``CUDA_RT_WHEEL_LIB`` (a ``libcuda_rt_c.so`` built already, as
``scripts/build-gpu.sh`` does with its ``gpu`` profile). ``CUDA_RT_SOURCE_DIR`` names
the repository when this folder is not inside it.

    pip wheel ./python --no-deps -w dist     # from the repository root

Only wheels are built from here (an sdist would have to carry the whole Rust
workspace): build with ``pip wheel`` or ``python -m build --wheel``.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

try:  # setuptools >= 70.1 carries bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools: the wheel package's
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
ROOT = pathlib.Path(os.environ.get("CUDA_RT_SOURCE_DIR") or HERE.parent).resolve()
LIB = "libcuda_rt_c.so"
PACKAGE = "cuda_rt_alloc"


def _version():
    """The workspace's version (``[workspace.package] version`` of the root
    Cargo.toml, else ``[package] version``), so the wheel and the crates agree."""
    manifest = ROOT / "Cargo.toml"
    if not manifest.is_file():
        raise SystemExit(
            f"{manifest} not found: build the wheel from the cuda-rt repository "
            "(pip wheel ./python), or set CUDA_RT_SOURCE_DIR to it"
        )
    text = manifest.read_text()
    try:
        import tomllib  # noqa: PLC0415 (Python 3.11+)

        data = tomllib.loads(text)
        version = data.get("workspace", {}).get("package", {}).get("version")
        if not isinstance(version, str):
            version = data.get("package", {}).get("version")
        if isinstance(version, str):
            return version
    except ImportError:
        for table in (r"workspace\.package", r"package"):
            m = re.search(
                rf"^\[{table}\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL
            )
            v = m and re.search(r'^version\s*=\s*"([^"]+)"', m.group(1), re.MULTILINE)
            if v:
                return v.group(1)
    raise SystemExit(f"no version in {manifest}")


def _built_library():
    """The path of ``libcuda_rt_c.so``: ``CUDA_RT_WHEEL_LIB``, else cargo's artifact."""
    given = os.environ.get("CUDA_RT_WHEEL_LIB")
    if given:
        path = pathlib.Path(given)
        if not path.is_file():
            raise SystemExit(f"CUDA_RT_WHEEL_LIB={given}: no such file")
        return path
    if shutil.which("cargo") is None:
        raise SystemExit(
            "cargo is not on PATH: install Rust (https://rustup.rs) to build the shim, "
            "or set CUDA_RT_WHEEL_LIB to a built libcuda_rt_c.so"
        )
    # The root package is the C shim; --lib builds its cdylib. Cargo's own messages
    # name the file, wherever CARGO_TARGET_DIR puts it.
    cmd = [
        "cargo",
        "build",
        "--release",
        "--lib",
        "--manifest-path",
        str(ROOT / "Cargo.toml"),
        "--message-format=json-render-diagnostics",
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit status {proc.returncode})")
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        for f in msg.get("filenames", []):
            if os.path.basename(f) == LIB:
                return pathlib.Path(f)
    raise SystemExit(f"cargo built no {LIB} (command: {' '.join(cmd)})")


class BuildShim(build_ext):
    """Puts the module and the shim in the build folder as the package
    ``cuda_rt_alloc`` (``__init__.py`` and ``libcuda_rt_c.so`` side by side)."""

    def run(self):
        dest = pathlib.Path(self.build_lib) / PACKAGE
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HERE / "cuda_rt_alloc.py", dest / "__init__.py")
        lib = dest / LIB
        shutil.copyfile(_built_library(), lib)
        lib.chmod(0o755)

    def get_outputs(self):
        dest = pathlib.Path(self.build_lib) / PACKAGE
        return [str(dest / "__init__.py"), str(dest / LIB)]


class BinaryDistribution(Distribution):
    """A distribution with a native library: platform folders and a platform wheel."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Tagged ``py3-none-<platform>``: the library is native, but loaded through
    ctypes, so it does not depend on the Python version or ABI."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    version=_version(),
    distclass=BinaryDistribution,
    cmdclass={"build_ext": BuildShim, "bdist_wheel": PlatformWheel},
    zip_safe=False,
)
