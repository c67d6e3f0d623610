"""``vector-add``: the guide's hello world, Triton and CUDA C++ against ``a + b``, as % of copy bandwidth.

out = a + b over N fp32 elements: no FLOPs worth counting, 3 * N * 4 bytes moved (a and b read, out
written), so the ceiling is the device-to-device copy bandwidth measured at the start of the run.
"""

from __future__ import annotations

import torch

from ..harness import Case, Provider, Suite, dtype_name, elementwise_bytes
from ..plots import Plot

# GPU: 2^12 (4 K elements, launch-bound) to 2^28 (1 GiB per vector, far beyond the 50-60 MB L2, so
# the big sizes measure HBM) in steps of 2x. CPU (interpreter): a few tiny sizes, seconds in all.
GPU_SIZES = tuple(2 ** e for e in range(12, 29))
GPU_QUICK = (2 ** 16, 2 ** 20, 2 ** 24, 2 ** 28)
CPU_SIZES = (2 ** 10, 2 ** 13, 2 ** 16)
CPU_QUICK = (2 ** 10, 2 ** 16)


def _flashfuse(backend: str):
    def factory(case: Case, a, b):
        from flashfuse.ops.vector_add import vector_add    # lazy: the suite lists even without it
        return lambda: vector_add(a, b, backend=backend)
    return factory


def _torch(case: Case, a, b):
    return lambda: a + b


class VectorAdd(Suite):
    name = "vector-add"
    description = "out = a + b, fp32: Triton and CUDA C++ kernels vs torch, GB/s and % of copy bandwidth"
    baseline = "torch"
    metric = "gbps"
    plots = (Plot("gbps", "GB/s", "gbps", xlabel="elements"),
             Plot("pct_ceiling", "% of copy bandwidth", "pct_copy", xlabel="elements"),
             Plot("speedup", "speedup vs torch (x)", "speedup", xlabel="elements"))

    def providers(self, opts):
        return [
            Provider("triton", _flashfuse("triton"), kind="flashfuse",
                     description="flashfuse.ops.vector_add, Triton kernel"),
            Provider("cuda", _flashfuse("cuda"), kind="flashfuse", needs_cuda=True,
                     description="flashfuse.ops.vector_add, CUDA C++ kernel (load_inline)"),
            Provider("torch", _torch, kind="baseline", description="a + b"),
        ]

    def cases(self, opts):
        if opts.gpu:
            sizes = GPU_QUICK if opts.quick else GPU_SIZES
        else:
            sizes = CPU_QUICK if opts.quick else CPU_SIZES
        cases = []
        for dtype in opts.dtypes or (torch.float32,):
            elem = torch.empty((), dtype=dtype).element_size()
            for n in sizes:
                cases.append(Case(
                    name=f"N=2^{n.bit_length() - 1} {dtype_name(dtype)}", params={"N": n}, dtype=dtype,
                    flops=float(n), bytes=elementwise_bytes(n, elem, n_inputs=2), ceiling="copy",
                    group=f"vector add {dtype_name(dtype)}", x=n))
        return cases

    def make_inputs(self, case, device):
        n = case.params["N"]
        return (torch.randn(n, device=device, dtype=case.dtype),
                torch.randn(n, device=device, dtype=case.dtype))

    def reference(self, case, a, b):
        return a + b                 # a, b upcast by the harness: the exact sum

    def tolerance(self, case):
        # One rounding of the sum: the error is at most half an ulp per element (fp32 2^-24 relative).
        return {torch.float32: 1e-6}.get(case.dtype, super().tolerance(case))

