"""cuda-rt's caching pool as the CUDA allocator of PyTorch or CuPy, in one call.

Needs only ``libcuda_rt_c.so`` (``cargo build --release`` builds it into
``target/release/``); nothing is compiled for Python. ::

    import cuda_rt_alloc
    cuda_rt_alloc.install_torch()   # before torch's first CUDA allocation
    # or
    cuda_rt_alloc.install_cupy()

    cuda_rt_alloc.stats(0)          # the pool's statistics on device 0
    cuda_rt_alloc.snapshot(0)       # segments and blocks, torch's _snapshot() shape
    cuda_rt_alloc.empty_cache()     # cached blocks back to the driver

The library is found through ``CUDA_RT_C_LIB`` (its file), else next to this module,
else in the repository's ``target/{release,gpu,debug}`` folders.
"""

import ctypes
import json
import os
import pathlib

__all__ = [
    "library_path",
    "install_torch",
    "install_cupy",
    "stats",
    "snapshot",
    "pinned_snapshot",
    "empty_cache",
    "live_allocations",
]

_NAME = "libcuda_rt_c.so"
_lib = None


class CudaRtError(RuntimeError):
    """A cuda-rt call failed: its status code and cuda-rt's message."""

    def __init__(self, call, code, message):
        super().__init__(f"{call} failed with status {code}: {message}")
        self.code = code


class PoolStats(ctypes.Structure):
    """``curt_pool_stats_t``."""

    _fields_ = [
        ("used_bytes", ctypes.c_uint64),
        ("total_bytes", ctypes.c_uint64),
        ("free_bytes", ctypes.c_uint64),
        ("n_free_blocks", ctypes.c_uint64),
        ("peak_used_bytes", ctypes.c_uint64),
        ("peak_total_bytes", ctypes.c_uint64),
    ]


def library_path():
    """The path of ``libcuda_rt_c.so`` this module uses (FileNotFoundError if none)."""
    tried = []
    env = os.environ.get("CUDA_RT_C_LIB")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    candidates = [here / _NAME]
    for profile in ("release", "gpu", "debug"):
        candidates.append(here.parent / "target" / profile / _NAME)
    for c in candidates:
        tried.append(str(c))
        if c.is_file():
            return str(c)
    raise FileNotFoundError(
        f"{_NAME} not found; set CUDA_RT_C_LIB to its file (tried: {', '.join(tried)})"
    )


def _library():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path())
        lib.curt_last_error.restype = ctypes.c_char_p
        lib.curt_pool_stats.argtypes = [ctypes.c_int, ctypes.POINTER(PoolStats)]
        lib.curt_pool_snapshot_json.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.curt_pinned_pool_snapshot_json.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.curt_dropin_live_count.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        _lib = lib
    return _lib


def _check(call, code):
    if code != 0:
        message = _library().curt_last_error().decode("utf-8", "replace")
        raise CudaRtError(call, code, message)


def install_torch():
    """Makes cuda-rt's pool PyTorch's CUDA allocator (``CUDAPluggableAllocator`` with
    ``curt_torch_alloc`` / ``curt_torch_free``). Call it before torch allocates CUDA
    memory. Returns the allocator object."""
    import torch  # noqa: PLC0415 (optional dependency)

    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), "curt_torch_alloc", "curt_torch_free"
    )
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def install_cupy():
    """Makes cuda-rt's pool CuPy's allocator (``CFunctionAllocator`` with
    ``curt_cupy_malloc`` / ``curt_cupy_free``). Returns the allocator object."""
    import cupy  # noqa: PLC0415 (optional dependency)

    lib = _library()
    malloc = ctypes.cast(lib.curt_cupy_malloc, ctypes.c_void_p).value
    free = ctypes.cast(lib.curt_cupy_free, ctypes.c_void_p).value
    alloc = cupy.cuda.memory.CFunctionAllocator(0, malloc, free, lib)
    cupy.cuda.set_allocator(alloc.malloc)
    return alloc


def stats(device=0):
    """The default pool's statistics on ``device``, as a dict."""
    s = PoolStats()
    _check("curt_pool_stats", _library().curt_pool_stats(device, ctypes.byref(s)))
    return {name: getattr(s, name) for name, _ in PoolStats._fields_}


def _text(call, fn):
    n = ctypes.c_size_t(0)
    fn(None, 0, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(call, fn(buf, len(buf), ctypes.byref(n)))
    return json.loads(buf.value.decode("utf-8"))


def snapshot(device=0):
    """The default pool's segments and blocks on ``device``, in the shape of
    ``torch.cuda.memory._snapshot()``."""
    lib = _library()
    return _text(
        "curt_pool_snapshot_json",
        lambda b, c, n: lib.curt_pool_snapshot_json(device, b, c, n),
    )


def pinned_snapshot():
    """The default pinned pool's segments and blocks."""
    lib = _library()
    return _text("curt_pinned_pool_snapshot_json", lib.curt_pinned_pool_snapshot_json)


def empty_cache():
    """Gives the default pool's cached blocks back to the driver (torch's
    ``empty_cache``)."""
    _check("curt_pool_free_all_blocks", _library().curt_pool_free_all_blocks())


def live_allocations():
    """How many allocations made through the drop-in entry points are alive."""
    n = ctypes.c_size_t(0)
    _check("curt_dropin_live_count", _library().curt_dropin_live_count(ctypes.byref(n)))
    return n.value
