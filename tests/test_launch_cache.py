"""ops/_triton.LaunchCache: the direct launch of an already compiled kernel (the Gluon attention kernels and their
preprocess). CPU tier: the cache's bookkeeping with a stand-in kernel (which compiled variant a launch takes, the
constexprs appended in signature order, the plain launch in the interpreter and under launch hooks). GPU tier:
its key against triton's own specialization, and repeated attention calls through it."""

import inspect

import pytest
import torch

from flashfuse.ops import _triton
from flashfuse.ops._triton import LaunchCache, _arg_specialization


class _Compiled:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls
        self.function, self.packed_metadata = f"fn-{name}", f"meta-{name}"

    def run(self, *launch):
        self.calls.append((self.name, launch))


class _Param:
    def __init__(self, name, default=inspect.Parameter.empty):
        self.name, self.default = name, default


class _Kernel:
    """Stands in for a JITFunction: kernel[grid](*args, **constexprs) 'compiles' one variant per call (None: as
    triton returns when a compile hook takes over)."""
    __name__ = "_kernel"
    params = [_Param("p_x"), _Param("n"), _Param("scale"), _Param("BLOCK"), _Param("num_warps"),
              _Param("EVEN", default=False)]

    def __init__(self, returns_none=False):
        self.compiles, self.calls, self.pre_run_hooks = [], [], []
        self.returns_none = returns_none

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            compiled = _Compiled(len(self.compiles), self.calls)
            self.compiles.append((grid, args, constexprs))
            return None if self.returns_none else compiled
        return launch


@pytest.fixture
def fast(monkeypatch):
    """The fast path as on the GPU machine (triton 3.6, compiled), with a fake current device and stream."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    monkeypatch.setattr(_triton, "_plain_launch_needed", lambda kernel: False)
    kernel = _Kernel()
    cache = LaunchCache(kernel)
    cache.fast = True
    return kernel, cache


def test_launch_cache_reuses_compiled_kernel(fast):
    kernel, cache = fast
    x = torch.zeros(64)
    cache((4, 2), x, 32, 0.5, BLOCK=128, num_warps=4)
    assert len(kernel.compiles) == 1 and kernel.calls == []            # the first launch goes through triton
    cache((7, ), x, 48, 0.25, BLOCK=128, num_warps=4)                  # same specialization: 32 and 48 are 16k
    assert len(kernel.compiles) == 1
    # every parameter in signature order: the runtime ones, then the constexprs (EVEN: its default)
    assert kernel.calls == [(0, (7, 1, 1, 1234, "fn-0", "meta-0", None, None, None, x, 48, 0.25, 128, 4, False))]


@pytest.mark.parametrize("change", ["int not a multiple of 16", "int 1", "int64", "constexpr", "dtype", "alignment"])
def test_launch_cache_new_specialization_compiles(fast, change):
    """Anything triton specializes on gives another compiled variant, never a launch of the wrong one."""
    kernel, cache = fast
    x = torch.zeros(64)
    cache((1, ), x, 32, 0.5, BLOCK=128, num_warps=4)
    args, constexprs = [x, 32, 0.5], dict(BLOCK=128, num_warps=4)
    if change == "int not a multiple of 16":
        args[1] = 33
    elif change == "int 1":
        args[1] = 1
    elif change == "int64":
        args[1] = 2 ** 32
    elif change == "constexpr":
        constexprs["BLOCK"] = 64
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    else:
        args[0] = x[1:]                                              # 4 bytes past a 16-byte boundary
    cache((1, ), *args, **constexprs)
    assert len(kernel.compiles) == 2 and kernel.calls == []


def test_arg_specialization_of_floats_and_bools():
    assert _arg_specialization(0.5) == _arg_specialization(3.0)
    assert _arg_specialization(True) != _arg_specialization(1)
    assert _arg_specialization(None) != _arg_specialization(0)


def test_launch_cache_constexpr_types_differ(fast):
    """EVEN=True and EVEN=1 compare equal in Python but compile differently."""
    kernel, cache = fast
    cache((1, ), torch.zeros(4), 16, 1.0, BLOCK=16, num_warps=1, EVEN=True)
    cache((1, ), torch.zeros(4), 16, 1.0, BLOCK=16, num_warps=1, EVEN=1)
    assert len(kernel.compiles) == 2 and kernel.calls == []


def test_launch_cache_missing_parameter(fast):
    kernel, cache = fast
    with pytest.raises(TypeError, match="'BLOCK' was not passed"):
        cache((1, ), torch.zeros(4), 16, 1.0, num_warps=1)


def test_launch_cache_keeps_nothing_when_triton_returns_none(monkeypatch):
    """A compile hook that takes over makes triton return None: every launch stays triton's own."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_triton, "_plain_launch_needed", lambda kernel: False)
    kernel = _Kernel(returns_none=True)
    cache = LaunchCache(kernel)
    cache.fast = True
    for _ in range(2):
        cache((1, ), torch.zeros(4), 16, 1.0, BLOCK=16, num_warps=1)
    assert len(kernel.compiles) == 2 and kernel.calls == [] and cache.compiled == {}


@pytest.mark.parametrize("reason", ["interpreter", "launch hook", "pre-run hook", "debug", "instrumentation"])
def test_launch_cache_plain_launch(monkeypatch, reason):
    """In the interpreter (this tier), and whenever something must see every launch, each launch is triton's own."""
    from triton import knobs

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kernel = _Kernel()
    cache = LaunchCache(kernel)
    assert not cache.fast                      # the interpreter
    if reason != "interpreter":
        cache.fast = True
        if reason == "launch hook":
            hook = lambda metadata: None       # noqa: E731
            knobs.runtime.launch_enter_hook.add(hook)
        elif reason == "pre-run hook":
            kernel.pre_run_hooks.append(lambda *a, **k: None)
        elif reason == "debug":
            monkeypatch.setattr(knobs.runtime, "debug", True)
        else:
            monkeypatch.setattr(knobs.compilation, "instrumentation_mode", "fpsan")
    try:
        for _ in range(2):
            cache((1, ), torch.zeros(4), 16, 1.0, BLOCK=16, num_warps=1)
    finally:
        if reason == "launch hook":
            knobs.runtime.launch_enter_hook.remove(hook)
    assert len(kernel.compiles) == 2 and kernel.calls == []


class _DescriptorLauncher:
    """Stands in for triton 3.6's CudaLauncher of a kernel with tensor-descriptor parameters: ``launch`` is the
    descriptor wrapper (a closure over the C launch and the descriptors' parameter indices, as
    wrap_handle_tensordesc builds it)."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False
    num_ctas = 1

    def __init__(self, calls, n_descriptors):
        launcher = lambda *launch: calls.append(("c", launch))          # noqa: E731
        tensordesc_indices = set(range(n_descriptors))

        def inner(*args):
            assert tensordesc_indices and launcher
            calls.append(("wrapped", args))
        self.launch = inner

    def __call__(self, *launch):            # CudaLauncher.__call__: scratch, then the wrapper
        self.launch(*launch)


class _DescriptorCompiled(_Compiled):
    def __init__(self, name, calls):
        super().__init__(name, calls)
        self.run = _DescriptorLauncher(calls, 2)
        meta = dict(swizzle=128, elem_size=2, elem_type=5, block_size=[1, 64, 1, 16], fp4_padded=False)
        self.metadata = type("Metadata", (), {"tensordesc_meta": [meta, dict(meta, swizzle=64)]})()


class _DescriptorKernel(_Kernel):
    params = [_Param("q_desc"), _Param("k_desc"), _Param("p_x"), _Param("n"), _Param("BLOCK")]

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.compiles.append((grid, args, constexprs))
            return _DescriptorCompiled(len(self.compiles) - 1, self.calls)
        return launch


def test_launch_with_descriptors_encodes_once_per_address(fast, monkeypatch):
    """A Launch with descriptor parameters: triton's own launch first, then LaunchCache's, then the C launch with each
    descriptor's encoding (CUtensorMap, shape, strides) made once per tensor address and kept."""
    from flashfuse.ops._triton import Launch

    encodings = []

    def fill(address, swizzle, elem_size, elem_type, block, shape, strides, padding):
        encodings.append((address, swizzle, elem_size, elem_type, tuple(block), padding))
        return f"map-{address}-{swizzle}"
    monkeypatch.setattr(_triton, "_fill_tma_descriptor", lambda: fill)
    monkeypatch.setattr(_triton, "bind_cuda_context", lambda: None)
    kernel = _DescriptorKernel()
    cache = LaunchCache(kernel)
    cache.fast = True
    shape, strides = [2, 256, 4, 16], [16384, 64, 16, 1]
    geometry = (shape, strides, [1, 64, 1, 16], "layout")
    launch = Launch(cache, (6, ), [geometry, geometry], BLOCK=64)
    q, k, k2, x = (torch.zeros(2, 256, 4, 16, dtype=torch.bfloat16) for _ in range(4))
    launch(q, k, x, 32)
    assert len(kernel.compiles) == 1 and kernel.calls == []
    grid, args, constexprs = kernel.compiles[0]
    assert grid == (6, ) and constexprs == dict(BLOCK=64) and args[2:] == (x, 32)
    assert [(d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding) for d in args[:2]] == [
        (t, shape, strides, [1, 64, 1, 16], "layout", "zero") for t in (q, k)]
    launch(q, k, x, 48)                                       # LaunchCache's launch, through the wrapper
    assert [kind for kind, _ in kernel.calls] == ["wrapped"] and encodings == []
    for key_tensor in (k, k, k2, k):
        launch(q, key_tensor, x, 64)
    assert [kind for kind, _ in kernel.calls] == ["wrapped"] + ["c"] * 4
    # one encoding per (descriptor, address): q and k, then k2; k's was kept
    e = 5                                                     # the device-side bf16 code; the host's is 5 too
    assert encodings == [(t.data_ptr(), swizzle, 2, e, (1, 64, 1, 16), 0)
                         for t, swizzle in ((q, 128), (k, 64), (k2, 64))]
    _, last = kernel.calls[-1]
    assert last == (6, 1, 1, 1234, "fn-0", False, False, None, None, "meta-0", None, None, None,
                    f"map-{q.data_ptr()}-128", *shape, *strides, f"map-{k.data_ptr()}-64", *shape, *strides, x, 64, 64)
    monkeypatch.setattr(_triton, "_plain_launch_needed", lambda kernel: True)
    launch(q, k, x, 64)                                       # a launch hook: triton's own path again
    assert len(kernel.compiles) == 2 and len(kernel.calls) == 5


def test_launch_with_descriptors_keeps_the_wrapper_it_does_not_know(fast, monkeypatch):
    """A launcher of another shape (no descriptor wrapper, descriptors not lowered to TMA, global scratch): the
    descriptors stay triton's to encode."""
    from flashfuse.ops._triton import EncodedLaunch

    compiled = _DescriptorCompiled(0, [])
    entry, grid, geometry = (compiled, (), 0), (1, ), ([1], [1], [1], None)
    assert EncodedLaunch.of(entry, grid, [geometry, geometry]) is not None
    assert EncodedLaunch.of(entry, grid, [geometry]) is None                 # descriptors elsewhere in the signature
    compiled.metadata.tensordesc_meta = [None, None]
    assert EncodedLaunch.of(entry, grid, [geometry, geometry]) is None
    compiled = _DescriptorCompiled(0, [])
    compiled.run.global_scratch_size = 128
    assert EncodedLaunch.of((compiled, (), 0), grid, [geometry, geometry]) is None
    compiled = _DescriptorCompiled(0, [])
    compiled.run.launch = print                                               # not a wrapper
    assert EncodedLaunch.of((compiled, (), 0), grid, [geometry, geometry]) is None


@pytest.mark.gpu
def test_arg_specialization_matches_triton_gpu():
    """Where the fast path runs (triton FAST_LAUNCH_TRITON on the GPU): arguments with the same key get the same
    specialization from triton itself."""
    import triton
    if not triton.__version__.startswith(_triton.FAST_LAUNCH_TRITON):
        pytest.skip(f"the fast launch is used with triton {_triton.FAST_LAUNCH_TRITON}x only (here {triton.__version__})")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    from flashfuse.ops._triton import host_descriptor
    from flashfuse.ops.attention.flash_fwd_hopper import sequence_geometry

    base = torch.zeros(1024, device="cuda", dtype=torch.bfloat16)
    seq = torch.zeros(2, 256, 4, 128, device="cuda", dtype=torch.bfloat16)
    descriptors = [host_descriptor(t, *sequence_geometry(2, 256, 4, t.shape[-1], t.stride(), box, t.dtype, t.shape[-1]))
                   for t, box in ((seq, 64), (seq, 128), (seq[:, :200], 64), (seq.half(), 64), (seq[..., :64], 64))]
    values = [0, 1, 2, 15, 16, 17, 32, -16, -1, 2 ** 31 - 16, 2 ** 31, 2 ** 40, 2 ** 63, 0.5, 1.0, True, False,
              base, base[8:], base[1:], base.float(), base.view(torch.int16), *descriptors]
    seen = {}
    for value in values:
        triton_spec = native_specialize_impl(CUDABackend, value, False, True, True)
        ours = _arg_specialization(value)
        assert seen.setdefault(ours, triton_spec) == triton_spec, (value, ours, triton_spec)


@pytest.mark.gpu
def test_repeated_attention_calls_gpu(monkeypatch):
    """The second and later calls (the direct launch, through their launch plans) give the first call's output, dK and
    dV bit for bit, also after a call of another specialization in between (seqlen 1000: not a multiple of 16); dQ
    within bf16 rounding in norm (the Gluon backward adds dQ with fp32 atomics, in no fixed order)."""
    from flashfuse import flash_attn_func
    from flashfuse.ops._triton import PlanCache
    from flashfuse.ops.attention import flash_bwd_hopper, flash_bwd_preprocess, flash_fwd_hopper
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("the cached launches are those of the Gluon kernels (sm_90, triton 3.6)")

    def call(seqlen, causal):
        torch.manual_seed(seqlen)
        q, k, v = (torch.randn(2, seqlen, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        out = flash_attn_func(q, k, v, causal=causal)
        out.backward(torch.ones_like(out))
        return [out.detach(), q.grad, k.grad, v.grad]

    caches = (flash_fwd_hopper._launch_forward, flash_bwd_hopper._launch_backward,
              flash_bwd_preprocess._launch_preprocess)
    for causal in (False, True):
        for c in caches:
            c.compiled.clear()       # (keys are specializations, which other tests' shapes share)
        for module, name in ((flash_fwd_hopper, "_PLANS"), (flash_bwd_hopper, "_PLANS"),
                             (flash_bwd_preprocess, "_PREPROCESS_PLANS")):
            monkeypatch.setattr(module, name, PlanCache())      # (plans keep their entries)
        first = call(4096, causal)
        for seqlen in (1000, 4096, 4096):
            again = call(seqlen, causal)
        # one compiled entry per specialization; the other launches of the four calls were direct
        assert [len(c.compiled) for c in caches] == [2, 2, 2]
        out, dq, dk, dv = again
        assert torch.equal(out, first[0]) and torch.equal(dk, first[2]) and torch.equal(dv, first[3])
        assert ((dq.float() - first[1].float()).norm() / first[1].float().norm()).item() < 2 ** -8


@pytest.mark.gpu
def test_encoded_descriptors_follow_their_tensors_gpu(monkeypatch):
    """Calls of one launch plan alternate between two sets of tensors (and fresh ones), well past the calls that set up
    the encoded launch: each gives its own first call's output, dK and dV bit for bit, so no call reads another's
    descriptors (the encodings are kept per address)."""
    from flashfuse import flash_attn_func
    from flashfuse.ops._triton import EncodedLaunch, PlanCache
    from flashfuse.ops.attention import flash_bwd_hopper, flash_bwd_preprocess, flash_fwd_hopper
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("the encoded launches are those of the Gluon kernels (sm_90, triton 3.6)")
    for module, name in ((flash_fwd_hopper, "_PLANS"), (flash_bwd_hopper, "_PLANS"),
                         (flash_bwd_preprocess, "_PREPROCESS_PLANS")):
        monkeypatch.setattr(module, name, PlanCache())

    def inputs(seed):
        torch.manual_seed(seed)
        return [torch.randn(2, 1024, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]

    def call(q, k, v):
        out = flash_attn_func(q, k, v, causal=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        return out.detach(), dk, dv

    sets = [inputs(0), inputs(1)]
    first = [call(*s) for s in sets]
    for i in range(6):
        for s, expected in zip(sets, first):
            assert all(torch.equal(a, b) for a, b in zip(call(*s), expected))
        fresh = [t.detach().clone().requires_grad_() for t in sets[i % 2]]
        assert all(torch.equal(a, b) for a, b in zip(call(*fresh), first[i % 2]))
    plans = list(flash_fwd_hopper._PLANS.plans.values()) + list(flash_bwd_hopper._PLANS.plans.values())
    assert len(plans) == 2 and all(isinstance(plan.launch.encoded, EncodedLaunch) for plan in plans)
