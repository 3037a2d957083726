"""The timer of the PyTorch side-by-side benchmarks (bench_torch_attention.py,
bench_torch_gemm.py), the same way bench_gpu and `bench attention` time theirs: CUDA events
around each run, untimed warm-up runs first, the median."""
import statistics


def median_ms(torch, fn, warmup, reps):
    """Median milliseconds of fn() over `reps` runs, each between two CUDA events, after
    `warmup` untimed runs. `torch` is the imported module (the callers import it late, to
    report its absence in one line)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
