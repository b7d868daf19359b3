"""The PyTorch user's hour on cuda-rt's drop-in allocator, on a GPU (issue 30).

    python3 torch_hour.py

Needs ``cuda_rt_alloc`` on PYTHONPATH and ``CUDA_RT_C_LIB`` (run by
``tests/python_workloads.rs``). In a fresh process, before torch allocates:
``install_torch()`` reports every hook installed; out of memory (past the device, past
a memory fraction) raises ``torch.cuda.OutOfMemoryError`` with torch's opening, so a
batch-size back-off that catches that type works; the process goes on; the peaks
reset (torch's own reset is refused under a pluggable allocator) and count the private
pools of captured graphs; statistics of a device that does not exist are an error.
Prints one line per check and ``TORCH HOUR PASSED`` last; exits 1 on a failure.
"""

import gc
import sys
import warnings

import cuda_rt_alloc

FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def out_of_memory(torch):
    """Past the device's memory: torch's own type and text; then a back-off that halves
    the request until it fits, catching only that type."""
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        check(
            str(e).startswith("CUDA out of memory. Tried to allocate"),
            f"1 PiB raises torch.cuda.OutOfMemoryError: {str(e)[:160]!r}",
        )
    except RuntimeError as e:  # the type this replaces
        check(False, f"1 PiB raises torch.cuda.OutOfMemoryError, not {type(e).__name__}: {e}")
    else:
        check(False, "1 PiB raises torch.cuda.OutOfMemoryError (nothing raised)")
    total = torch.cuda.get_device_properties(0).total_memory
    n, tries, t = 4 * total, 0, None
    while t is None and tries < 20:
        tries += 1
        try:
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            n //= 2
    check(
        t is not None and n < total and tries >= 3,
        f"a back-off catching torch.cuda.OutOfMemoryError fits after {tries} tries "
        f"({n / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)",
    )
    del t
    torch.cuda.empty_cache()
    check(float(torch.ones(1000, device="cuda").sum()) == 1000.0, "the process goes on")


def memory_fraction(torch):
    """Past a memory fraction (the pool's limit): the same type."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.05, 0)
    try:
        try:
            torch.empty(total // 10, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            check("limit" in str(e), f"past the fraction: torch.cuda.OutOfMemoryError: {str(e)[:160]!r}")
        else:
            check(False, "past the fraction: torch.cuda.OutOfMemoryError (nothing raised)")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    x = torch.empty(total // 10, dtype=torch.uint8, device="cuda")
    check(x.numel() == total // 10, "the same size fits with the fraction back at 1.0")
    del x
    torch.cuda.empty_cache()


def peaks(torch):
    """reset_peak restarts the peaks; torch's own reset is refused (why the helper has
    one)."""
    dev = 0
    torch.cuda.synchronize()
    cuda_rt_alloc.reset_peak(dev)
    base = cuda_rt_alloc.stats(dev)
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del x
    s = cuda_rt_alloc.stats(dev)
    check(
        s["peak_used_bytes"] >= base["used_bytes"] + (64 << 20),
        f"the peak counts a 64 MiB tensor gone since ({s['peak_used_bytes']} bytes)",
    )
    cuda_rt_alloc.reset_peak(dev)
    s = cuda_rt_alloc.stats(dev)
    check(
        s["peak_used_bytes"] == s["used_bytes"] and s["peak_total_bytes"] == s["total_bytes"],
        f"reset_peak restarts the peaks from now ({s['peak_used_bytes']} == {s['used_bytes']})",
    )
    check(
        cuda_rt_alloc.max_memory_allocated(dev) == s["peak_used_bytes"]
        and cuda_rt_alloc.max_memory_reserved(dev) == s["peak_total_bytes"],
        "max_memory_allocated / max_memory_reserved read the same peaks",
    )
    try:
        torch.cuda.reset_peak_memory_stats()
    except RuntimeError as e:
        check("pluggable" in str(e).lower() or "support" in str(e).lower(),
              f"torch's own reset is refused: {str(e)[:100]!r}")
    else:
        check(True, "torch's own reset did not complain (this torch supports it)")


def graph_peaks(torch):
    """A captured graph's private pool counts in the peak, and stays in it after the
    graph is released."""
    dev = 0
    torch.cuda.synchronize()
    cuda_rt_alloc.reset_peak(dev)
    a = torch.randn(2048, 2048, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            (a @ a).relu()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = (a @ a).relu() * 2.0  # temporaries of 16 MiB in the graph's pool
    g.replay()
    torch.cuda.synchronize()
    s = cuda_rt_alloc.stats(dev)
    check(s["graph_pools_bytes"] >= 16 << 20, f"the graph holds a private pool ({s['graph_pools_bytes']} bytes)")
    check(
        s["peak_total_bytes"] >= s["total_bytes"] + s["graph_pools_bytes"],
        f"the reserved peak counts it ({s['peak_total_bytes']} >= {s['total_bytes']} + "
        f"{s['graph_pools_bytes']})",
    )
    check(
        s["peak_used_bytes"] >= s["used_bytes"] + out.numel() * 4,
        "the in-use peak counts the graph's output",
    )
    peak = s["peak_total_bytes"]
    del g, out
    gc.collect()
    torch.cuda.synchronize()
    s = cuda_rt_alloc.stats(dev)
    check(s["peak_total_bytes"] >= peak, "the peak keeps the graph's pool after its release")


def missing_device(torch):
    n = torch.cuda.device_count()
    try:
        cuda_rt_alloc.stats(n)
    except cuda_rt_alloc.CudaRtError as e:
        check("device" in str(e), f"stats({n}) of a device that does not exist: {e}")
    else:
        check(False, f"stats({n}) of a device that does not exist raises CudaRtError")


def main():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        report = cuda_rt_alloc.install_torch()
    import torch  # noqa: PLC0415 (after the allocator is installed)

    print(report)
    check(not report.skipped and not w, "install_torch installed every hook")
    out_of_memory(torch)
    memory_fraction(torch)
    peaks(torch)
    graph_peaks(torch)
    missing_device(torch)
    print("TORCH HOUR FAILED" if FAILURES else "TORCH HOUR PASSED")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
