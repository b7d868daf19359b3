"""A CuPy workload on CuPy's own memory pool or on cuda-rt's pool.

    python3 cupy_workload.py cupy|curt OUT.json [--rounds N]

Runs in a fresh process: elementwise kernels, reductions, matmul, FFT, linalg,
random numbers and sorting on arrays of several sizes, N rounds. Writes a digest of
every result (to compare the two runs exactly), the time per round and the peak
reserved bytes to OUT.json; ``tests/python_workloads.rs`` compares two runs.
"""

import hashlib
import json
import sys
import time


def main():
    mode, out = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 20
    if mode == "curt":
        import cuda_rt_alloc  # noqa: PLC0415

        allocator = type(cuda_rt_alloc.install_cupy()).__name__
    else:
        allocator = "MemoryPool"
    import cupy as cp  # noqa: PLC0415

    digests = []

    def one_round(seed, record):
        rs = cp.random.RandomState(seed)
        for n in (1 << 10, 1 << 16, 1 << 20, 1 << 22):
            x = rs.standard_normal(n, dtype=cp.float32)
            y = rs.uniform(-1, 1, n).astype(cp.float32)
            z = cp.sin(x) * cp.exp(-y * y) + x * y  # elementwise
            s = cp.stack([z.sum(), z.max(), z.min(), cp.abs(z).mean(), z.std()])
            srt = cp.sort(z)
            arg = cp.argsort(y)
            f = cp.fft.rfft(z)
            parts = [s, srt[:: max(1, n // 64)], arg[:: max(1, n // 64)], cp.abs(f[:64])]
            if record:
                digests.append(digest(cp, parts))
        for m in (64, 512, 2048):
            a = rs.standard_normal((m, m), dtype=cp.float32)
            b = rs.standard_normal((m, m), dtype=cp.float32)
            c = a @ b
            spd = a @ a.T + m * cp.eye(m, dtype=cp.float32)
            sol = cp.linalg.solve(spd, b[:, :8])
            q, r = cp.linalg.qr(a[:, : m // 2])
            ch = cp.linalg.cholesky(spd)
            f2 = cp.fft.fft2(a[:256, :256])
            parts = [c[:: max(1, m // 16)], sol, r[:8, :8], ch[:8, :8], cp.abs(f2[:8, :8])]
            if record:
                digests.append(digest(cp, parts))

    one_round(0, record=False)  # warm-up: kernels compiled, plans made
    cp.cuda.Device().synchronize()
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        one_round(r, record=(r < 3))
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    if mode == "curt":
        import cuda_rt_alloc  # noqa: PLC0415

        peak = cuda_rt_alloc.stats(0)["peak_total_bytes"]
    else:
        # CuPy's pool keeps what it reserved until free_all_blocks: its total now is
        # its peak.
        peak = cp.get_default_memory_pool().total_bytes()
    # After the peak is read: CuPy's pool gives back everything it cached when an
    # allocation fails.
    sections = streams_and_oom(cp, mode)
    with open(out, "w") as f:
        json.dump(
            {
                "mode": mode,
                "cupy": cp.__version__,
                "digests": digests,
                "median_round_s": times[len(times) // 2],
                "peak_reserved": peak,
                "sections": sections,
                "allocator": allocator,
            },
            f,
        )


def streams_and_oom(cp, mode):
    """Work on a non-blocking stream (on cuda-rt, its memory comes from that stream's
    arena, as CuPy's pool keys its free lists by stream) and an allocation past the
    device's memory, which must raise CuPy's OutOfMemoryError."""
    out = {}
    st = cp.cuda.Stream(non_blocking=True)
    with st:
        x = cp.ones(1 << 20, dtype=cp.float32)
        total = (x * 2).sum()
    st.synchronize()
    out["stream_values_ok"] = float(total) == float(2 << 20)
    if mode == "curt":
        import cuda_rt_alloc  # noqa: PLC0415

        ptr = x.data.ptr
        segs = [
            s
            for s in cuda_rt_alloc.snapshot(0)["segments"]
            if s["address"] <= ptr < s["address"] + s["total_size"]
        ]
        out["arena_stream_ok"] = len(segs) == 1 and segs[0]["stream"] == st.ptr
    del x, total
    try:
        cp.empty(1 << 52, dtype=cp.uint8)
        out["oom"] = "no error raised"
    except cp.cuda.memory.OutOfMemoryError as e:
        out["oom"] = "ok"
        out["oom_message"] = str(e)
    except Exception as e:  # noqa: BLE001 (the verdict names what was raised)
        out["oom"] = f"{type(e).__name__}: {e}"
    return out


def digest(cp, arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(cp.asnumpy(a).tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    main()
