"""Runs a workload on the framework's own allocator and on cuda-rt's, alternately in
fresh processes, and judges the pair.

    python3 compare.py torch|cupy [--runs N] [--speed-floor F]

Prints ``figure:`` lines; exits 1 with the reason when results differ or cuda-rt
reserved more memory at its peak. Speed is a figure, not a verdict: on a shared,
noisy GPU host a floor fails at random, so it is judged only when ``--speed-floor F``
is given (cuda-rt's median speed at least F of the framework's), as a benchmark run
may ask. Needs ``cuda_rt_alloc`` on PYTHONPATH and ``CUDA_RT_C_LIB``.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def pin():
    """Each run on the same few cores, so that the two allocators meet the same
    scheduler (the loops are launch-bound: host time is what they measure)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 8:
        os.sched_setaffinity(0, cores[2:6])


def run(script, mode, extra=()):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        subprocess.run(
            [sys.executable, os.path.join(HERE, script), mode, out, *extra],
            check=True,
            preexec_fn=pin,
        )
        with open(out) as f:
            return json.load(f)


def fail(why):
    print("FAILED:", why)
    sys.exit(1)


def alternate(script, native_mode, runs):
    """`runs` runs of `script` on each allocator, one pair at a time, alternating which
    goes first so neither always follows the other: (native results, cuda-rt's)."""
    native, ours = [], []
    for i in range(runs):
        pair = [(native_mode, native), ("curt", ours)]
        for mode, into in pair if i % 2 == 0 else pair[::-1]:
            into.append(run(script, mode))
    return native, ours


def torch(runs, floor):
    native, ours = alternate("torch_workload.py", "torch", runs)
    for r in native + ours:
        if not r["side_stream"]["ok"]:
            fail(f"{r['mode']}: the side-stream section computed wrong values")
        if not r["graph"]["ok"]:
            fail(f"{r['mode']}: torch.cuda.graph: {r['graph']}")
        if not r["oom"]["ok"]:
            fail(f"{r['mode']}: an allocation past the device's memory: {r['oom']}")
    a, b = native[0]["losses"], ours[0]["losses"]
    diff = max(abs(x - y) for x, y in zip(a, b))
    # Each run's median window (torch_workload.py), then the median over the runs; the
    # ratio of each adjacent pair is printed too, as the pairs shared the machine's state.
    sn = statistics.median(r["window_steps_per_s"] for r in native)
    so = statistics.median(r["window_steps_per_s"] for r in ours)
    pairs = [o["window_steps_per_s"] / n["window_steps_per_s"] for n, o in zip(native, ours)]
    pn = max(r["peak_reserved"] for r in native)
    po = max(r["peak_reserved"] for r in ours)
    print(
        f"figure: torch {native[0]['torch']} training loop, {len(a)} steps, final loss {a[-1]:.4f}, "
        f"losses bitwise equal: {a == b} (max diff {diff:.2e}); steps/s (median window, median "
        f"of {runs} runs): torch {sn:.2f}, cuda-rt {so:.2f}, ratio {so / sn:.3f}; pair ratios "
        f"{[round(p, 3) for p in pairs]} (median {statistics.median(pairs):.3f}); "
        f"(runs: torch {[round(r['window_steps_per_s'], 2) for r in native]}, "
        f"cuda-rt {[round(r['window_steps_per_s'], 2) for r in ours]}; whole-run steps/s torch "
        f"{[round(r['steps_per_s'], 2) for r in native]}, cuda-rt "
        f"{[round(r['steps_per_s'], 2) for r in ours]}); peak reserved torch "
        f"{pn / 2**20:.1f} MiB, cuda-rt {po / 2**20:.1f} MiB, ratio {po / pn:.3f}; "
        f"allocator counters torch {native[0]['allocator']}, cuda-rt {ours[0]['allocator']}; "
        f"graph capture, side stream and out-of-memory: ok (cuda-rt's error: "
        f"{ours[0]['oom']['message']!r})"
    )
    if diff > 1e-3:
        fail(f"losses differ by up to {diff}")
    if floor and so < floor * sn:
        fail(f"cuda-rt at {so / sn:.3f}x torch's steps/s")
    if po > pn:
        fail(f"cuda-rt reserved {po} bytes at its peak, torch {pn}")


def cupy(runs, floor):
    native, ours = alternate("cupy_workload.py", "cupy", runs)
    for r in native + ours:
        sec = r["sections"]
        if not sec["stream_values_ok"]:
            fail(f"{r['mode']}: wrong values on a non-blocking stream")
        if not sec.get("arena_stream_ok", True):
            fail(f"{r['mode']}: memory allocated under a stream is not on that stream's arena")
        if sec["oom"] != "ok":
            fail(f"{r['mode']}: an allocation past the device's memory: {sec['oom']}")
    if native[0]["digests"] != ours[0]["digests"]:
        fail("CuPy's results differ on cuda-rt's pool")
    tn = statistics.median(r["median_round_s"] for r in native)
    to = statistics.median(r["median_round_s"] for r in ours)
    pn = max(r["peak_reserved"] for r in native)
    po = max(r["peak_reserved"] for r in ours)
    print(
        f"figure: cupy {native[0]['cupy']} workload ({len(native[0]['digests'])} results equal): "
        f"round {tn * 1e3:.2f} ms on cupy's pool, {to * 1e3:.2f} ms on cuda-rt's, speed ratio "
        f"{tn / to:.3f}; peak reserved cupy {pn / 2**20:.1f} MiB, cuda-rt {po / 2**20:.1f} MiB, "
        f"ratio {po / pn:.3f}; cuda-rt through {ours[0]['allocator']}; stream arena and out-of-memory: ok (cuda-rt's error: "
        f"{ours[0]['sections']['oom_message']!r})"
    )
    if floor and tn / to < floor:
        fail(f"cuda-rt at {tn / to:.3f}x CuPy's speed")
    if po > pn:
        fail(f"cuda-rt reserved {po} bytes at its peak, CuPy {pn}")


if __name__ == "__main__":
    which = sys.argv[1]
    {"torch": torch, "cupy": cupy}[which](arg("--runs", 5), arg("--speed-floor", 0.0))
