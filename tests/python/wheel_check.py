"""Checks an installed ``cuda-rt-alloc`` wheel (no GPU needed): the module imports from
the installed package, not from the checkout; it loads the library bundled beside it
(``CUDA_RT_C_LIB`` unset); statistics and snapshots read; installing into a framework
that is not installed says which one is missing.

Run it with the Python the wheel is installed in, outside the checkout's ``python/``::

    venv/bin/python tests/python/wheel_check.py

Prints ``ok <library path>`` and exits 0, or fails with an assertion.
"""

import importlib.util
import os
import pathlib
import sys

assert "CUDA_RT_C_LIB" not in os.environ, "unset CUDA_RT_C_LIB: the bundled library is checked"
import cuda_rt_alloc as c  # noqa: E402

package = pathlib.Path(c.__file__).resolve().parent
assert package.name == "cuda_rt_alloc", f"not the installed package: {c.__file__}"
assert pathlib.Path(sys.prefix) in package.parents, (
    f"cuda_rt_alloc comes from {package}, not from this Python's prefix {sys.prefix}"
)
lib = pathlib.Path(c.library_path())
assert lib == package / "libcuda_rt_c.so", f"not the bundled library: {lib}"

s = c.stats(0)
assert set(s) >= {"used_bytes", "total_bytes", "peak_total_bytes", "graph_pools_bytes"}, s
snap = c.snapshot(0)
assert "segments" in snap and "device_traces" in snap, snap
assert isinstance(c.pinned_snapshot()["segments"], list)
c.empty_cache()
assert c.live_allocations() == 0

for name, install in (("torch", c.install_torch), ("cupy", c.install_cupy)):
    if importlib.util.find_spec(name) is None:
        try:
            install()
        except ImportError as e:
            assert name in str(e), e
        else:
            raise AssertionError(f"install_{name}() worked without {name}")

print("ok", lib)
