"""Timing and ceilings for the benchmark harness (protocol: ../shared/BENCHMARKING.md): the median time of a
call (do_bench with CUDA events, or CUDA-graph replays, on the GPU; wall clock on the CPU) and the measured
copy-bandwidth and matmul ceilings every row is reported against."""

from __future__ import annotations

import gc
import platform
import statistics
import time

import torch

# Ceilings. GPU: the protocol's >= 1 GiB device-to-device copy and a bf16 8192^3 matmul. CPU: small
# versions (64 MiB, 1024^3) that take well under a second on two cores.
GPU_COPY_BYTES, GPU_MATMUL_N = 1 << 30, 8192
CPU_COPY_BYTES, CPU_MATMUL_N = 64 << 20, 1024
# On CPU every timing is meaningless (interpreter), so one timed call after the checked one is enough.
CPU_TIMED_CALLS = 1



def bench_ms(fn, gpu: bool, cpu_calls: int = CPU_TIMED_CALLS, rep_ms: int = 100, cuda_graph: bool = False) -> float:
    """Median milliseconds of one call: do_bench with CUDA events on the GPU; wall clock on the CPU.

    ``cuda_graph``: the calls are captured into a CUDA graph and its replays timed
    (``do_bench_cudagraph``), which leaves out what the host spends per call (Python, launches, the
    autograd engine's hand-off to its device thread). BENCHMARKING.md's method for many small launches,
    and for this GPU machine's host, whose Python on the autograd thread costs more than a norm's kernels.
    The call must be capturable (no host synchronisation); a provider that is not gets an ERROR row."""
    if gpu:
        import triton.testing
        if cuda_graph:
            return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
        return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))
    times = []
    for _ in range(cpu_calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure_ceilings(device: str | None = None, copy_bytes: int | None = None,
                     matmul_n: int | None = None) -> dict:
    """Copy bandwidth (bytes read + written) and bf16 matmul throughput on random data."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    copy_bytes = copy_bytes or (GPU_COPY_BYTES if gpu else CPU_COPY_BYTES)
    n = matmul_n or (GPU_MATMUL_N if gpu else CPU_MATMUL_N)
    src = torch.randn(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src), gpu, cpu_calls=5)
    src = dst = None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    mm_ms = bench_ms(lambda: a @ b, gpu, cpu_calls=5)
    a = b = None
    _free_memory(gpu)
    return {
        "device": torch.cuda.get_device_name(torch.device(device)) if gpu else cpu_name(), "cpu": not gpu,
        "copy_bytes": copy_bytes, "copy_ms": copy_ms, "copy_GBps": 2 * copy_bytes / copy_ms / 1e6,
        "matmul_n": n, "matmul_dtype": "bfloat16", "matmul_ms": mm_ms,
        "matmul_TFLOPS": 2.0 * n ** 3 / mm_ms / 1e9,
        "note": ("measured on the GPU: device-to-device copy and bf16 matmul on random data" if gpu else
                 "CPU numbers (small copy and matmul on the host CPU), not GPU ceilings"),
    }


def cpu_name() -> str:
    return f"CPU ({platform.processor() or platform.machine()})"


def _free_memory(gpu: bool) -> None:
    """After an OOM or an exception (whose frames may sit in reference cycles) and between cases. On the
    CPU there is nothing to give back, and gc.collect() costs ~0.1 s, so it is skipped there."""
    if gpu:
        gc.collect()
        torch.cuda.empty_cache()
