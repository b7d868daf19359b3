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
        ("mallocs", ctypes.c_uint64),
        ("frees", ctypes.c_uint64),
        ("cache_hits", ctypes.c_uint64),
        ("cache_misses", ctypes.c_uint64),
        ("backend_allocs", ctypes.c_uint64),
        ("backend_frees", ctypes.c_uint64),
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
        lib.curt_dropin_alloc.restype = ctypes.c_void_p
        lib.curt_dropin_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.curt_cupy_free.restype = None
        lib.curt_cupy_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.curt_torch_graph_pools_reserved.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_uint64),
        ]
        _lib = lib
    return _lib


def _check(call, code):
    if code != 0:
        message = _library().curt_last_error().decode("utf-8", "replace")
        raise CudaRtError(call, code, message)


def install_torch():
    """Makes cuda-rt's pool PyTorch's CUDA allocator (``CUDAPluggableAllocator`` with
    ``curt_torch_alloc`` / ``curt_torch_free``). Call it before torch allocates CUDA
    memory. Returns the allocator object.

    Also set: the CUDA-graph hooks (``torch.cuda.graph`` captures into a private
    pool per graph, kept until the graph is released, as torch's own allocator
    does), ``torch.cuda.empty_cache()`` and
    ``torch.cuda.set_per_process_memory_fraction()``. An allocation that fails
    raises torch's ``RuntimeError`` with cuda-rt's message at the operator that
    allocated (torch does not check its allocator for NULL; cuda-rt throws torch's
    own ``c10::Error`` instead of returning one)."""
    import torch  # noqa: PLC0415 (optional dependency)

    path = library_path()
    lib = _library()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "curt_torch_alloc", "curt_torch_free")
    hooks = alloc._allocator

    def address(name):
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

    for setter, name in (
        ("set_begin_allocate_to_pool", "curt_torch_begin_allocate_to_pool"),
        ("set_end_allocate_to_pool_fn", "curt_torch_end_allocate_to_pool"),
        ("set_release_pool", "curt_torch_release_pool"),
        ("set_reset_fn", "curt_torch_empty_cache"),
        ("set_memory_fraction_fn", "curt_torch_set_memory_fraction"),
        ("set_record_stream_fn", "curt_torch_record_stream"),
    ):
        if hasattr(hooks, setter) and hasattr(lib, name):
            getattr(hooks, setter)(address(name))
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


class CupyParam(ctypes.Structure):
    """``curt_cupy_param_t`` (wrapper.h): what ``curt_cupy_malloc`` calls to read CuPy's
    current stream and to raise an exception."""

    _fields_ = [
        ("current_stream", ctypes.c_void_p),
        ("set_error", ctypes.c_void_p),
        ("out_of_memory", ctypes.c_void_p),
        ("error", ctypes.c_void_p),
    ]


def _cupy_current_stream_function(cupy):
    """The address of CuPy's C API ``get_current_stream_ptr`` (``intptr_t (void)``),
    or None where this CuPy does not export it."""
    capi = getattr(cupy.cuda.stream, "__pyx_capi__", {})
    capsule = capi.get("get_current_stream_ptr")
    if capsule is None:
        return None
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = get_name(capsule)
    # Cython names the capsule with the C signature ("intptr_t (void)", an exception
    # clause possibly after it).
    if name is None or not name.replace(b" ", b"").startswith(b"intptr_t(void)"):
        return None
    return get_pointer(capsule, name)


def install_cupy(python=False):
    """Makes cuda-rt's pool CuPy's allocator. Returns the allocator object.

    CuPy's ``CFunctionAllocator`` with ``curt_cupy_malloc`` / ``curt_cupy_free``: no
    Python on the allocation path. Memory comes from the arena of CuPy's current stream
    (read through CuPy's C API, as CuPy's own pool reads it), and a failure raises
    CuPy's ``OutOfMemoryError`` (or ``CudaRtError``) from the allocation. Where this
    CuPy does not export its current stream, or with ``python=True``, a
    ``PythonFunctionAllocator`` that does the same in Python (slower per call)."""
    import cupy  # noqa: PLC0415 (optional dependency)

    lib = _library()
    current = None if python else _cupy_current_stream_function(cupy)
    if current is not None:

        # The C side raises with one message (PyErr_SetString): types made from it.
        class OutOfMemoryError(cupy.cuda.memory.OutOfMemoryError):
            def __init__(self, message):
                MemoryError.__init__(self, message)

        class AllocationError(CudaRtError):
            def __init__(self, message):
                RuntimeError.__init__(self, f"curt_cupy_malloc failed: {message}")
                self.code = -1

        param = CupyParam(
            current,
            ctypes.cast(ctypes.pythonapi.PyErr_SetString, ctypes.c_void_p).value,
            id(OutOfMemoryError),
            id(AllocationError),
        )
        malloc = ctypes.cast(lib.curt_cupy_malloc, ctypes.c_void_p).value
        free = ctypes.cast(lib.curt_cupy_free, ctypes.c_void_p).value
        # The owner keeps the parameter block, the library and the exception types
        # alive as long as CuPy holds the allocator.
        owner = (param, lib, OutOfMemoryError, AllocationError)
        alloc = cupy.cuda.memory.CFunctionAllocator(
            ctypes.addressof(param), malloc, free, owner
        )
        cupy.cuda.set_allocator(alloc.malloc)
        return alloc
    c_alloc, c_free = lib.curt_dropin_alloc, lib.curt_cupy_free
    current_stream = cupy.cuda.get_current_stream
    oom = cupy.cuda.memory.OutOfMemoryError

    def malloc(size, device):
        ptr = c_alloc(size, device, current_stream().ptr)
        if not ptr and size:
            message = lib.curt_last_error().decode("utf-8", "replace")
            if "out of memory" in message.lower():
                s = stats(device)
                raise oom(size, s["total_bytes"], 0)
            raise CudaRtError("curt_dropin_alloc", -1, message)
        return ptr or 0

    def free(ptr, device):
        c_free(None, ptr, device)

    alloc = cupy.cuda.memory.PythonFunctionAllocator(malloc, free)
    cupy.cuda.set_allocator(alloc.malloc)
    return alloc


def stats(device=0):
    """The default pool's statistics on ``device``, as a dict; ``graph_pools_bytes``
    is what the private pools of PyTorch's captured graphs hold now."""
    s = PoolStats()
    lib = _library()
    _check("curt_pool_stats", lib.curt_pool_stats(device, ctypes.byref(s)))
    out = {name: getattr(s, name) for name, _ in PoolStats._fields_}
    g = ctypes.c_uint64(0)
    _check(
        "curt_torch_graph_pools_reserved",
        lib.curt_torch_graph_pools_reserved(device, ctypes.byref(g)),
    )
    out["graph_pools_bytes"] = g.value
    return out


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
