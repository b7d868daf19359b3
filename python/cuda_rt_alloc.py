"""cuda-rt's caching pool as the CUDA allocator of PyTorch or CuPy, in one call.

Needs only ``libcuda_rt_c.so`` (``cargo build --release`` builds it into
``target/release/``); nothing is compiled for Python. ::

    import cuda_rt_alloc
    print(cuda_rt_alloc.install_torch())  # before torch's first CUDA allocation;
                                          # says which hooks it installed
    # or
    cuda_rt_alloc.install_cupy()

    cuda_rt_alloc.stats(0)          # the pool's statistics on device 0
    cuda_rt_alloc.reset_peak(0)     # torch's reset_peak_memory_stats(), refused under
                                    # a pluggable allocator
    cuda_rt_alloc.snapshot(0)       # segments and blocks, torch's _snapshot() shape
    cuda_rt_alloc.empty_cache()     # cached blocks back to the driver

The library is ``CUDA_RT_C_LIB`` (its file, or a folder holding it) when set, else the
first found of: beside this module, ``$CARGO_TARGET_DIR/{release,gpu,debug}``, the
repository's ``target/{release,gpu,debug}``, and the GPU build's ``gpu-bin/lib``
(``scripts/build-gpu.sh``). Not found, or not loadable, is an ``OSError`` that says
every place tried.

PyTorch: torch 2.0 or newer (``CUDAPluggableAllocator``); the private pools of CUDA
graphs need torch 2.3 or newer (the ``set_begin_allocate_to_pool`` hooks).
"""

import ctypes
import json
import os
import pathlib
import warnings

__all__ = [
    "library_path",
    "install_torch",
    "TorchInstall",
    "install_cupy",
    "stats",
    "reset_peak",
    "max_memory_allocated",
    "max_memory_reserved",
    "snapshot",
    "pinned_snapshot",
    "empty_cache",
    "live_allocations",
]

# The oldest torch with CUDAPluggableAllocator, and the oldest with the graph-pool
# hooks in the shape curt_torch_begin_allocate_to_pool has (older ones are named
# set_begin_allocate_stream_to_pool, with another signature).
MIN_TORCH = (2, 0)
GRAPH_POOLS_TORCH = (2, 3)

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


def _candidates():
    """Where ``libcuda_rt_c.so`` is looked for when ``CUDA_RT_C_LIB`` is not set, in
    order: beside this module first (where a wheel puts it), then cargo's and the GPU
    build's folders."""
    here = pathlib.Path(__file__).resolve().parent
    yield here / _NAME
    targets = []
    if os.environ.get("CARGO_TARGET_DIR"):
        targets.append(pathlib.Path(os.environ["CARGO_TARGET_DIR"]))
    targets.append(here.parent / "target")
    for target in targets:
        for profile in ("release", "gpu", "debug"):
            yield target / profile / _NAME
    yield here.parent / "gpu-bin" / "lib" / _NAME


def library_path():
    """The path of ``libcuda_rt_c.so`` this module uses: ``CUDA_RT_C_LIB`` (a file, or a
    folder holding it), else the first found of the places the module docs list. A
    ``FileNotFoundError`` naming every place tried when there is none."""
    env = os.environ.get("CUDA_RT_C_LIB")
    if env:
        path = pathlib.Path(env)
        if path.is_dir():
            path = path / _NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"CUDA_RT_C_LIB={env!r}: no {_NAME} there (tried {path}); set it to the "
                f"library's file or folder, or unset it to search "
                f"{', '.join(str(c) for c in _candidates())}"
            )
        return str(path)
    tried = []
    for c in _candidates():
        tried.append(str(c))
        if c.is_file():
            return str(c)
    raise FileNotFoundError(
        f"{_NAME} not found (build it with `cargo build --release`, or set CUDA_RT_C_LIB "
        f"to its file); tried: {', '.join(tried)}"
    )


def _load(path):
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        how = "CUDA_RT_C_LIB" if os.environ.get("CUDA_RT_C_LIB") else "found by the search"
        raise OSError(f"{path} ({how}) could not be loaded as {_NAME}: {e}") from e


def _library():
    global _lib
    if _lib is None:
        lib = _load(library_path())
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
        lib.curt_torch_memory_peaks.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint64),
        ]
        lib.curt_pool_reset_peaks.argtypes = [ctypes.c_int]
        _lib = lib
    return _lib


def _check(call, code):
    if code != 0:
        message = _library().curt_last_error().decode("utf-8", "replace")
        raise CudaRtError(call, code, message)


def _version(text):
    """``(major, minor)`` of a version string such as ``"2.5.1+cu124"``."""
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts + [0] * (2 - len(parts)))


# What install_torch sets besides the two entry points: (setter of torch's
# allocator object, function of the library, what it gives). The graph trio goes in
# together or not at all.
_GRAPH_HOOKS = (
    ("set_begin_allocate_to_pool", "curt_torch_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "curt_torch_end_allocate_to_pool"),
    ("set_release_pool", "curt_torch_release_pool"),
)
_OTHER_HOOKS = (
    ("set_reset_fn", "curt_torch_empty_cache", "torch.cuda.empty_cache()"),
    (
        "set_memory_fraction_fn",
        "curt_torch_set_memory_fraction",
        "torch.cuda.set_per_process_memory_fraction()",
    ),
    ("set_record_stream_fn", "curt_torch_record_stream", "Tensor.record_stream()"),
)


class TorchInstall:
    """What :func:`install_torch` did: ``allocator`` (torch's
    ``CUDAPluggableAllocator``), ``installed`` (the hooks set, by what they serve),
    ``skipped`` (hook -> why not), ``torch_version`` and ``library`` (the path loaded).
    ``str()`` of it is a one-paragraph report."""

    def __init__(self, allocator, installed, skipped, torch_version, library):
        self.allocator = allocator
        self.installed = installed
        self.skipped = skipped
        self.torch_version = torch_version
        self.library = library

    def __str__(self):
        text = (
            f"cuda-rt's pool ({self.library}) is torch {self.torch_version}'s CUDA "
            f"allocator; hooks installed: {', '.join(self.installed) or 'none'}"
        )
        if self.skipped:
            text += "; skipped: " + "; ".join(f"{k} ({v})" for k, v in self.skipped.items())
        return text

    __repr__ = __str__


def install_torch():
    """Makes cuda-rt's pool PyTorch's CUDA allocator (``CUDAPluggableAllocator`` with
    ``curt_torch_alloc`` / ``curt_torch_free``). Call it before torch allocates CUDA
    memory. Needs torch 2.0 or newer (a ``RuntimeError`` says so for an older one).

    Returns a :class:`TorchInstall` saying which hooks were installed, and warns
    (``RuntimeWarning``) for each one skipped with the reason (a torch without the
    setter, a library without the function):

    - CUDA graphs: ``torch.cuda.graph`` captures into a private pool per graph, kept
      until the graph is released, as torch's own allocator does (torch 2.3 or newer;
      without them a graph's memory goes back to the pool after the capture, and
      tensors made later may share it with the graph's replays);
    - ``torch.cuda.empty_cache()``, ``torch.cuda.set_per_process_memory_fraction()``
      and ``Tensor.record_stream()`` reach the pool.

    Out of memory raises ``torch.cuda.OutOfMemoryError`` ("CUDA out of memory. Tried
    to allocate ...", with the pool's figures) at the operator that allocated, as with
    torch's own allocator; another failure a ``RuntimeError`` with cuda-rt's message
    (torch does not check its allocator for NULL: cuda-rt throws torch's own C++
    exceptions instead of returning one). torch's ``memory_stats()`` and
    ``reset_peak_memory_stats()`` are refused under any pluggable allocator: use
    :func:`stats` and :func:`reset_peak`."""
    import torch  # noqa: PLC0415 (optional dependency)

    version = _version(torch.__version__)
    if version < MIN_TORCH:
        raise RuntimeError(
            f"cuda_rt_alloc.install_torch needs torch {MIN_TORCH[0]}.{MIN_TORCH[1]} or "
            f"newer (torch.cuda.memory.CUDAPluggableAllocator); this is torch "
            f"{torch.__version__}"
        )
    path = library_path()
    lib = _library()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "curt_torch_alloc", "curt_torch_free")
    hooks = alloc._allocator
    installed, skipped = [], {}

    def address(name):
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

    def missing(setter, name):
        if not hasattr(hooks, setter):
            return f"torch {torch.__version__} has no {setter}"
        if not hasattr(lib, name):
            return f"{path} does not export {name}"
        return None

    why = next(filter(None, (missing(s, n) for s, n in _GRAPH_HOOKS)), None)
    if why is None:
        for setter, name in _GRAPH_HOOKS:
            getattr(hooks, setter)(address(name))
        installed.append("CUDA-graph private pools")
    else:
        need = f"torch {GRAPH_POOLS_TORCH[0]}.{GRAPH_POOLS_TORCH[1]} or newer"
        skipped["CUDA-graph private pools"] = (
            f"{why}; needs {need}. Without them a captured graph's memory goes back to "
            f"the pool after the capture, and tensors made later may share it with the "
            f"graph's replays"
        )
    for setter, name, what in _OTHER_HOOKS:
        why = missing(setter, name)
        if why is None:
            getattr(hooks, setter)(address(name))
            installed.append(what)
        else:
            skipped[what] = f"{why}; it does not reach cuda-rt's pool"
    torch.cuda.memory.change_current_allocator(alloc)
    for what, why in skipped.items():
        warnings.warn(
            f"cuda_rt_alloc.install_torch: {what} not installed: {why}",
            RuntimeWarning,
            stacklevel=2,
        )
    return TorchInstall(alloc, installed, skipped, torch.__version__, path)


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
    is what the private pools of PyTorch's captured graphs hold now, and the peaks
    (``peak_used_bytes``, ``peak_total_bytes``) count them too, as torch's
    ``max_memory_allocated()`` / ``max_memory_reserved()`` do, since the last
    :func:`reset_peak`. A device that does not exist (or no usable CUDA) raises
    :class:`CudaRtError`."""
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
    used, reserved = ctypes.c_uint64(0), ctypes.c_uint64(0)
    _check(
        "curt_torch_memory_peaks",
        lib.curt_torch_memory_peaks(device, ctypes.byref(used), ctypes.byref(reserved)),
    )
    out["peak_used_bytes"] = used.value
    out["peak_total_bytes"] = reserved.value
    return out


def reset_peak(device=0):
    """Restarts the peaks of ``device`` (those of :func:`stats`, graph pools included)
    from the current values: torch's ``reset_peak_memory_stats()``, which torch refuses
    under a pluggable allocator."""
    _check("curt_pool_reset_peaks", _library().curt_pool_reset_peaks(device))


def max_memory_allocated(device=0):
    """Peak bytes in use on ``device`` since the last :func:`reset_peak`, graph pools
    included (torch's ``max_memory_allocated``)."""
    return stats(device)["peak_used_bytes"]


def max_memory_reserved(device=0):
    """Peak bytes reserved on ``device`` since the last :func:`reset_peak`, graph pools
    included (torch's ``max_memory_reserved``)."""
    return stats(device)["peak_total_bytes"]


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
