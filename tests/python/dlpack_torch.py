"""DLPack between cuda-rt's C API and PyTorch, through ctypes and PyCapsules.

    python3 dlpack_torch.py

Exports a cuda-rt memory handle to torch (``torch.from_dlpack`` of a "dltensor"
capsule): torch reads the bytes cuda-rt wrote, writes its own, and the memory lives
until torch's tensor goes although the handle was freed first. Imports a torch tensor
(``__dlpack__``) as a cuda-rt handle: cuda-rt reads torch's values, and freeing the
handle gives the tensor back (its deleter runs once). Prints ``ok`` or raises.
"""

import ctypes
import sys

import cuda_rt_alloc  # noqa: F401 (the library path)
import torch


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


def main():
    lib = ctypes.CDLL(cuda_rt_alloc.library_path())
    lib.curt_last_error.restype = ctypes.c_char_p
    api = ctypes.pythonapi
    api.PyCapsule_New.restype = ctypes.py_object
    api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

    def check(code, what):
        if code != 0:
            raise RuntimeError(f"{what}: {code}: {lib.curt_last_error().decode()}")

    torch.zeros(1, device="cuda")  # torch's context first: the primary context
    n = 1024
    f32 = DLDataType(2, 32, 1)
    mem = ctypes.c_void_p()
    check(lib.curt_malloc_device(0, ctypes.c_size_t(n * 4), ctypes.byref(mem)), "malloc")
    values = (ctypes.c_float * n)(*[float(i) for i in range(n)])
    check(lib.curt_memcpy_htod(mem, ctypes.c_size_t(0), values, ctypes.c_size_t(n * 4)), "htod")
    tensor = ctypes.c_void_p()
    shape = (ctypes.c_int64 * 2)(32, 32)
    check(lib.curt_memory_to_dlpack(mem, 2, shape, f32, ctypes.byref(tensor)), "to_dlpack")
    check(lib.curt_free(mem), "free")  # the tensor keeps the memory
    t = torch.from_dlpack(api.PyCapsule_New(tensor, b"dltensor", None))
    assert t.shape == (32, 32) and t.dtype == torch.float32 and t.is_cuda, t
    assert torch.equal(t.flatten().cpu(), torch.arange(n, dtype=torch.float32)), "export"
    t.mul_(2)
    torch.cuda.synchronize()
    assert float(t.sum()) == 2 * n * (n - 1) / 2

    # Import: a non-contiguous view (strides honoured), freed by cuda-rt.
    src = torch.arange(64 * 8, dtype=torch.float32, device="cuda").reshape(64, 8)
    view = src.t()  # 8 x 64, strides (1, 8): spans all 512 elements
    cap = view.__dlpack__()
    ptr = api.PyCapsule_GetPointer(cap, b"dltensor")
    imported = ctypes.c_void_p()
    check(lib.curt_memory_from_dlpack(ctypes.c_void_p(ptr), ctypes.byref(imported)), "from_dlpack")
    api.PyCapsule_SetName(cap, b"used_dltensor")  # consumed: the capsule must not delete it
    size = ctypes.c_size_t()
    check(lib.curt_memory_size(imported, ctypes.byref(size)), "size")
    assert size.value == 64 * 8 * 4, size.value
    back = (ctypes.c_float * (64 * 8))()
    check(lib.curt_memcpy_dtoh(back, imported, ctypes.c_size_t(0), size), "dtoh")
    assert list(back) == [float(i) for i in range(64 * 8)], "import"
    check(lib.curt_free(imported), "free imported")  # torch's deleter runs here
    del cap, view, t
    torch.cuda.synchronize()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
