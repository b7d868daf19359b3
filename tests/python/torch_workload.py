"""A PyTorch training loop on torch's own caching allocator or on cuda-rt's pool.

    python3 torch_workload.py torch|curt OUT.json [--steps N] [--profile]

Runs in a fresh process (an allocator is chosen before the first CUDA allocation):
a small Transformer (fixed seed, bf16 autocast, AdamW) for N steps, then a section
on a side stream and a ``torch.cuda.graph`` capture with replays. Writes the losses,
steps/s, peak reserved bytes and each section's verdict to OUT.json; the comparison
of two runs is ``tests/python_workloads.rs``'s.
"""

import json
import os
import sys
import time

WINDOW = 20


def main():
    mode, out = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 300
    profile = "--profile" in sys.argv
    if mode == "curt":
        import cuda_rt_alloc  # noqa: PLC0415

        cuda_rt_alloc.install_torch()
    import torch  # noqa: PLC0415

    result = {"mode": mode, "torch": torch.__version__}
    result.update(train(torch, steps, profile))
    result["side_stream"] = side_stream(torch)
    result["graph"] = graph_capture(torch)
    result["oom"] = out_of_memory(torch)
    torch.cuda.synchronize()
    if mode == "curt":
        import cuda_rt_alloc  # noqa: PLC0415

        s = cuda_rt_alloc.stats(0)
        result["peak_reserved"] = s["peak_total_bytes"]
        result["peak_used"] = s["peak_used_bytes"]
        result["allocator"] = {
            k: s[k] for k in ("mallocs", "cache_misses", "backend_allocs", "backend_frees")
        }
    else:
        result["peak_reserved"] = torch.cuda.max_memory_reserved()
        result["peak_used"] = torch.cuda.max_memory_allocated()
        m = torch.cuda.memory_stats()
        result["allocator"] = {
            "mallocs": m.get("allocation.all.allocated", 0),
            "segments": m.get("segment.all.allocated", 0),
            "segment_frees": m.get("segment.all.freed", 0),
            "retries": m.get("num_alloc_retries", 0),
        }
    with open(out, "w") as f:
        json.dump(result, f)


def model_and_data(torch, seed=0):
    nn = torch.nn
    torch.manual_seed(seed)
    vocab, d, heads, layers, seq, batch = 8192, 512, 8, 6, 256, 32
    layer = nn.TransformerEncoderLayer(
        d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True
    )
    model = nn.Sequential(
        nn.Embedding(vocab, d),
        nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
        nn.Linear(d, vocab),
    ).cuda()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    data = torch.randint(0, vocab, (8, batch, seq + 1), generator=gen)
    return model, data, vocab


def train(torch, steps, profile):
    model, data, vocab = model_and_data(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []

    def step(i):
        batch = data[i % data.shape[0]].cuda(non_blocking=True)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = loss_fn(logits.reshape(-1, vocab).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    warmup = min(20, steps // 4)
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    # Timed in windows of WINDOW steps, each ended by a synchronize: the median window
    # is what the comparison judges, as a burst of load from elsewhere on the shared
    # machine slows a window or two, not the run.
    rates = []
    t0 = time.perf_counter()
    start, begun = warmup, t0
    while start < steps:
        end = min(start + WINDOW, steps)
        for i in range(start, end):
            step(i)
        torch.cuda.synchronize()
        now = time.perf_counter()
        rates.append((end - start) / (now - begun))
        start, begun = end, now
    elapsed = time.perf_counter() - t0
    out = {
        "losses": [float(v) for v in torch.stack(losses).cpu()],
        "steps_per_s": (steps - warmup) / elapsed,
        "window_steps_per_s": sorted(rates)[len(rates) // 2],
    }
    if profile:
        from torch.profiler import ProfilerActivity, profile as prof  # noqa: PLC0415

        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for i in range(10):
                step(i)
            torch.cuda.synchronize()
        table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        with open(os.environ.get("PROFILE_OUT", "/tmp/profile.txt"), "a") as f:
            f.write(f"==== {sys.argv[1]}\n{table}\n")
    return out


def side_stream(torch):
    """Work on a second stream with its own temporaries, joined back: same values as on
    the main stream."""
    torch.manual_seed(1)
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    expect = ((a @ b).relu() + a).sum(dim=0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = []
        for _ in range(8):
            t = (a @ b).relu()  # temporaries allocated and freed on the side stream
            outs.append((t + a).sum(dim=0))
    torch.cuda.current_stream().wait_stream(side)
    for o in outs:
        o.record_stream(torch.cuda.current_stream())
    ok = all(torch.equal(o, expect) for o in outs)
    # record_stream: a block the side stream still reads is freed on the main stream;
    # the next allocation must not get it before the side stream is done.
    x = torch.full((1 << 24,), 1.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # the side stream busy for a while
        y = x * 2  # reads x after the sleep
    x.record_stream(side)
    del x
    z = torch.full((1 << 24,), 7.0, device="cuda")  # x's size: its block, if free
    torch.cuda.current_stream().wait_stream(side)
    recorded = bool((y == 2).all()) and bool((z == 7).all())
    return {"ok": bool(ok and recorded), "record_stream_ok": recorded}


def graph_capture(torch):
    """Captures a small MLP step with temporaries, allocates and fills other tensors
    after the capture, replays: the outputs match eager and the other tensors are
    untouched (a graph whose memory went back to the pool would overwrite them)."""
    torch.manual_seed(2)
    net = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    static_in = torch.randn(256, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            net(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(g):
            static_out = net(static_in) * 2.0
    except Exception as e:  # noqa: BLE001 (reported, judged by the caller)
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    # Tensors made after the capture, of the sizes the graph's temporaries had.
    others = [torch.full((256, 4096), float(i), device="cuda") for i in range(8)]
    ok = True
    with torch.no_grad():
        for i in range(5):
            static_in.copy_(torch.randn(256, 1024, device="cuda"))
            g.replay()
            torch.cuda.synchronize()
            ok &= bool(torch.allclose(static_out, net(static_in) * 2.0, rtol=1e-4, atol=1e-4))
        intact = all(bool((t == float(i)).all()) for i, t in enumerate(others))
    del g
    torch.cuda.synchronize()
    return {"ok": bool(ok and intact), "outputs_match": bool(ok), "others_intact": intact}


def out_of_memory(torch):
    """An allocation past the device's memory raises torch.cuda.OutOfMemoryError on
    either allocator (never a NULL tensor, never a plain RuntimeError, which code that
    backs off on out of memory does not catch), and the process goes on working."""
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        raised = str(e).startswith("CUDA out of memory")
        message = str(e).splitlines()[0][:200]
    except RuntimeError as e:
        raised = False
        message = f"{type(e).__name__}, not torch.cuda.OutOfMemoryError: {str(e)[:200]}"
    else:
        raised, message = False, "no error"
    after = float(torch.ones(1000, device="cuda").sum())
    return {"ok": bool(raised and after == 1000.0), "message": message}


if __name__ == "__main__":
    main()
