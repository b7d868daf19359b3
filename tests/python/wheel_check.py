"""Checks an installed ``cuda-rt-alloc`` wheel (no GPU needed): the module imports from
the installed package, not from the checkout; it loads the library bundled beside it
(``CUDA_RT_C_LIB`` unset); statistics and snapshots read where a driver loads (the real
one, or the fake of scripts/fake-libcuda.c through ``CUDA_RT_LIBCUDA``), and where none
does, the error names the driver; installing into a framework that is not installed says
which one is missing. ``WHEEL_CHECK_NEEDS_DRIVER=1`` makes a missing driver a failure.

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

try:
    s = c.stats(0)
except c.CudaRtError as e:
    # No driver on this machine: the error says so, naming what was tried.
    assert os.environ.get("WHEEL_CHECK_NEEDS_DRIVER") != "1", e
    assert "libcuda" in str(e) and "not found" in str(e), e
    print("no CUDA driver here: statistics and snapshots not read;", str(e).splitlines()[0])
else:
    assert set(s) >= {"used_bytes", "total_bytes", "peak_total_bytes", "graph_pools_bytes"}, s
    snap = c.snapshot(0)
    assert "segments" in snap and "device_traces" in snap, snap
    assert isinstance(c.pinned_snapshot()["segments"], list)
    c.empty_cache()
    assert c.live_allocations() == 0
    # A device that does not exist is an error, not zeros.
    try:
        c.stats(1 << 20)
    except c.CudaRtError:
        pass
    else:
        raise AssertionError("stats() of a device that does not exist returned")

for name, install in (("torch", c.install_torch), ("cupy", c.install_cupy)):
    if importlib.util.find_spec(name) is None:
        try:
            install()
        except ImportError as e:
            assert name in str(e), e
        else:
            raise AssertionError(f"install_{name}() worked without {name}")

print("ok", lib)
