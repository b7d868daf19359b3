"""A serving-style benchmark where the allocator matters: inference whose batch size and
sequence length drift from request to request, on the framework's own allocator and on
cuda-rt's drop-in, with and without expandable segments. Figures, never a verdict.

    python3 serving.py torch [--runs N] [--steps N]    # the four torch settings
    python3 serving.py cupy [--runs N] [--rounds N]    # CuPy's pool against cuda-rt's
    python3 serving.py one MODE OUT.json [...]          # one run (what the above spawn)

torch: a 6-layer fp16 Transformer encoder (d_model 512, 8 heads) under
``torch.inference_mode``, batch 1-64 and sequence 16-512 drawn from a fixed seed per
step, every setting seeing the same requests. Settings: ``torch`` (torch's caching
allocator), ``torch_exp`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``),
``curt`` (cuda-rt's drop-in), ``curt_exp`` (the drop-in with
``CUDA_RT_EXPANDABLE_SEGMENTS=1``). Runs alternate in fresh processes, one setting
after the other, N rounds; each reports steps/s (after a warm-up) and peak reserved and
used bytes. The summary prints, per setting, the median steps/s and the largest peak
reserved, and cuda-rt's expandable setting against torch's best of each (the goal:
>= 1.0x steps/s, <= 0.9x peak reserved).

cupy: a drifting-shape pipeline (elementwise, reductions, matmul on shapes drawn per
round) on CuPy's pool (``cupy``), on cuda-rt's drop-in (``cupy_curt``) and on the
drop-in with expandable segments (``cupy_curt_exp``, ``CUDA_RT_EXPANDABLE_SEGMENTS=1``:
what CuPy's own pool cannot do): time per round and peak reserved.

Needs ``cuda_rt_alloc`` on PYTHONPATH and ``CUDA_RT_C_LIB`` for the cuda-rt settings.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_SETTINGS = ("torch", "torch_exp", "curt", "curt_exp")
CUPY_SETTINGS = ("cupy", "cupy_curt", "cupy_curt_exp")


def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def env_for(setting):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("CUDA_RT_EXPANDABLE_SEGMENTS", None)
    if setting == "torch_exp":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if setting in ("curt_exp", "cupy_curt_exp"):
        env["CUDA_RT_EXPANDABLE_SEGMENTS"] = "1"
    return env


def requests(steps, seed=0):
    """The drifting requests: (batch, seq) per step, the same for every setting."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    return [(rng.randint(1, 64), rng.randint(16, 512)) for _ in range(steps)]


def torch_run(setting, steps):
    if setting.startswith("curt"):
        import cuda_rt_alloc  # noqa: PLC0415

        cuda_rt_alloc.install_torch()
    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    d, heads, layers = 512, 8, 6
    layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    model = model.cuda().half().eval()
    reqs = requests(steps)
    warmup = min(30, steps // 5)

    def serve(batch, seq):
        x = torch.randn(batch, seq, d, device="cuda", dtype=torch.float16)
        y = model(x)
        # A response leaves the device: a small reduction read back.
        return float(y[:, 0, :8].float().sum())

    checksum = 0.0
    with torch.inference_mode():
        for b, s in reqs[:warmup]:
            checksum += serve(b, s)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b, s in reqs[warmup:]:
            checksum += serve(b, s)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    out = {
        "setting": setting,
        "torch": torch.__version__,
        "steps_per_s": (steps - warmup) / elapsed,
        "checksum": checksum,
    }
    if setting.startswith("curt"):
        import cuda_rt_alloc  # noqa: PLC0415

        st = cuda_rt_alloc.stats(0)
        out["peak_reserved"] = st["peak_total_bytes"]
        out["peak_used"] = st["peak_used_bytes"]
    else:
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
        out["peak_used"] = torch.cuda.max_memory_allocated()
    return out


def cupy_run(setting, rounds):
    if setting.startswith("cupy_curt"):
        import cuda_rt_alloc  # noqa: PLC0415

        cuda_rt_alloc.install_cupy()
    import cupy as cp  # noqa: PLC0415
    import random  # noqa: PLC0415

    rng = random.Random(0)
    shapes = [
        [(rng.randint(1, 64) * 64, rng.randint(1, 64) * 64) for _ in range(8)]
        for _ in range(rounds + 2)
    ]

    def one_round(r):
        acc = 0.0
        for m, n in shapes[r]:
            a = cp.random.standard_normal((m, n), dtype=cp.float32)
            b = cp.random.standard_normal((n, m // 2 or 1), dtype=cp.float32)
            c = cp.tanh(a) * a + 1.0
            p = c @ b
            acc += float(p.sum()) + float(c.max())
        return acc

    for r in range(2):
        one_round(r)
    cp.cuda.Device().synchronize()
    times = []
    for r in range(2, rounds + 2):
        t0 = time.perf_counter()
        one_round(r)
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    out = {"setting": setting, "cupy": cp.__version__, "median_round_s": statistics.median(times)}
    if setting.startswith("cupy_curt"):
        import cuda_rt_alloc  # noqa: PLC0415

        out["peak_reserved"] = cuda_rt_alloc.stats(0)["peak_total_bytes"]
    else:
        out["peak_reserved"] = cp.get_default_memory_pool().total_bytes()
        # CuPy keeps no peak: the pool's total after the run is its high-water mark,
        # as it never returns memory unless asked.
    return out


def spawn(setting, extra):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        subprocess.run(
            [sys.executable, __file__, "one", setting, out, *extra],
            check=True,
            env=env_for(setting),
        )
        with open(out) as f:
            return json.load(f)


def compare(settings, runs, extra):
    """`runs` rounds of every setting, rotating which goes first."""
    results = {s: [] for s in settings}
    for i in range(runs):
        order = settings[i % len(settings):] + settings[: i % len(settings)]
        for s in order:
            results[s].append(spawn(s, extra))
    return results


def mib(b):
    return b / 2**20


def torch_summary(results):
    rate = {s: statistics.median(r["steps_per_s"] for r in rs) for s, rs in results.items()}
    peak = {s: max(r["peak_reserved"] for r in rs) for s, rs in results.items()}
    used = {s: max(r["peak_used"] for r in rs) for s, rs in results.items()}
    sums = {round(r["checksum"], 1) for rs in results.values() for r in rs}
    for s in results:
        print(
            f"figure: serving {s}: {rate[s]:.1f} steps/s, peak reserved {mib(peak[s]):.0f} MiB "
            f"(peak used {mib(used[s]):.0f} MiB, {peak[s] / max(used[s], 1):.2f}x)"
        )
    best_rate = max(rate["torch"], rate["torch_exp"])
    best_peak = min(peak["torch"], peak["torch_exp"])
    for s in ("curt", "curt_exp"):
        print(
            f"figure: serving {s} vs torch's best: steps/s {rate[s] / best_rate:.3f}x "
            f"(goal >= 1.0 for curt_exp), peak reserved {peak[s] / best_peak:.3f}x "
            f"(goal <= 0.9 for curt_exp)"
        )
    print(f"figure: serving checksums agree across settings: {len(sums) == 1}")


def cupy_summary(results):
    t = {s: statistics.median(r["median_round_s"] for r in rs) for s, rs in results.items()}
    peak = {s: max(r["peak_reserved"] for r in rs) for s, rs in results.items()}
    print(
        f"figure: drifting cupy pipeline: round {t['cupy'] * 1e3:.2f} ms on CuPy's pool, "
        f"{t['cupy_curt'] * 1e3:.2f} ms on cuda-rt's (speed {t['cupy'] / t['cupy_curt']:.3f}x); "
        f"peak reserved {mib(peak['cupy']):.0f} MiB vs {mib(peak['cupy_curt']):.0f} MiB "
        f"({peak['cupy_curt'] / peak['cupy']:.3f}x)"
    )
    print(
        f"figure: drifting cupy pipeline with expandable segments (cuda-rt only): round "
        f"{t['cupy_curt_exp'] * 1e3:.2f} ms (speed vs CuPy's pool "
        f"{t['cupy'] / t['cupy_curt_exp']:.3f}x); peak reserved "
        f"{mib(peak['cupy_curt_exp']):.0f} MiB ({peak['cupy_curt_exp'] / peak['cupy']:.3f}x "
        f"CuPy's)"
    )


def main():
    which = sys.argv[1]
    if which == "one":
        setting, out = sys.argv[2], sys.argv[3]
        if setting in TORCH_SETTINGS:
            r = torch_run(setting, arg("--steps", 380))
        else:
            r = cupy_run(setting, arg("--rounds", 20))
        with open(out, "w") as f:
            json.dump(r, f)
    elif which == "torch":
        steps = arg("--steps", 380)
        torch_summary(compare(TORCH_SETTINGS, arg("--runs", 3), ["--steps", str(steps)]))
    elif which == "cupy":
        rounds = arg("--rounds", 20)
        cupy_summary(compare(CUPY_SETTINGS, arg("--runs", 3), ["--rounds", str(rounds)]))
    else:
        sys.exit(f"usage: {sys.argv[0]} torch|cupy|one ...")


if __name__ == "__main__":
    main()
