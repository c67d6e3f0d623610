"""Small pieces every Triton kernel file shares."""

import functools
import inspect

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.language.extra import libdevice

from .._env import INTERPRET

try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDescriptor
except ImportError:          # (a triton without Gluon: nothing here builds descriptors then)
    _GluonDescriptor = None

# Triton's interpreter computes tl.dot with numpy, which has no bfloat16: a bf16 x bf16 dot there gives
# garbage (seen with triton 3.9). In the interpreter, `dot` upcasts the operands to fp32 first (exact
# for bf16 inputs); compiled, it is a plain tensor-core tl.dot.
IN_INTERPRETER = tl.constexpr(INTERPRET)


@triton.jit
def dot(a, b, acc):
    """acc + a @ b with fp32 accumulation. fp32 operands on the GPU use "tf32x3" (three tf32 products on
    tensor cores, close to fp32 accuracy; plain tf32 would cost ~1e-3 relative error)."""
    if IN_INTERPRETER:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    elif a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def tanh(x):
    """tanh with relative accuracy near 0 (libdevice's, 2 ulp). The interpreter has no libdevice: there
    tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|), exact enough in numpy's fp32."""
    if IN_INTERPRETER:
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)
    else:
        return libdevice.tanh(x)


@functools.lru_cache(maxsize=None)
def _sm_count_of(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (the current one when it has no index), cached: launch
    plans size their grids with it."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


def tma_scratch(size: int, alignment: int, stream):
    """Global scratch for device-side tensor descriptors (TMA; 128 bytes per descriptor per program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def ensure_tma_allocator() -> None:
    """Kernels that build tensor descriptors on the device need triton.set_allocator: set tma_scratch
    unless the caller set an allocator (a context variable: per thread)."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(tma_scratch)


# Host-side integer helpers. triton.cdiv and triton.next_power_of_2 are constexpr functions since triton 3.x:
# called from Python they wrap and unwrap every argument, ~2 us a call here and ~10 us on the GPU machine's
# CPU, several times per launch. Launch plans use these plain versions instead.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int, minimum: int = 1) -> int:
    return max(1 << (n - 1).bit_length() if n > 0 else 1, minimum)


# The triton release whose launcher signature LaunchCache calls directly (the GPU image's; measured there).
FAST_LAUNCH_TRITON = "3.6."


def _arg_specialization(arg):
    """What triton 3.6 specializes a runtime argument on (triton's native_specialize_impl): an int's width,
    divisibility by 16 and value 1; a tensor's dtype and 16-byte alignment; a tensor descriptor's dtype, block
    shape and layout; a float or bool by type only."""
    kind = type(arg)
    if kind is int or (kind is not bool and isinstance(arg, int)):
        return (arg == 1, arg % 16 == 0, -2 ** 31 <= arg < 2 ** 31, arg < 2 ** 63)
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if arg is None or isinstance(arg, (bool, float)):
        return kind
    return (kind, arg.base.dtype, tuple(arg.block_shape), arg.layout)      # a host-side TensorDescriptor


class LaunchCache:
    """`kernel[grid](*args, **constexprs)` without triton's per-launch argument binding: triton binds, specializes
    and hashes every argument on each launch, ~25 us of host time per launch on the GPU machine, a quarter of what
    a short attention call costs in all (benchmarks/NOTES.md, session 17). The compiled kernel is kept per
    (device, constexprs, runtime arguments' specialization as triton 3.6 derives it) and launched directly; a
    new combination goes through triton's path once. Only on the release whose launcher this calls
    (FAST_LAUNCH_TRITON), and only while nothing else must see each launch (launch or pre-run hooks, debug or
    instrumentation modes); the interpreter and other releases take the plain launch. Runtime arguments are
    passed positionally, before the constexprs in the kernel's signature; the grid is a tuple.

    ``ptx_args``: for a kernel whose last runtime arguments are facts of its own compiled code (the shared-memory
    offset of a barrier array that inline asm addresses: group_norm_details/_hopper_fwd.py's slot_barrier_offset), a
    function of (PTX, constexprs) giving those arguments. Callers pass the others; the kernel is compiled (not run)
    once per variant to read them, with 0 in their place (their values stay runtime arguments: one compile)."""

    def __init__(self, kernel, ptx_args=None):
        self.kernel = kernel
        self.compiled = {}
        self.fast = not INTERPRET and triton.__version__.startswith(FAST_LAUNCH_TRITON)
        self.ptx_args, self.from_ptx = ptx_args, {}

    def __call__(self, grid, *args, **constexprs):
        """kernel[grid](*args, **constexprs). Returns the cache entry it launched (for `run`), or None where triton's
        own path ran."""
        if not self.fast or _plain_launch_needed(self.kernel):
            extra = self._args_from_ptx(self._key(args, constexprs), grid, args, constexprs) if self.ptx_args else ()
            self.kernel[grid](*args, *extra, **constexprs)
            return None
        key = self._key(args, constexprs)
        entry = self.compiled.get(key)
        if entry is None:
            extra = self._args_from_ptx(key, grid, args, constexprs) if self.ptx_args else ()
            compiled = self.kernel[grid](*args, *extra, **constexprs)
            if compiled is not None:               # (None: a compile hook took over; nothing to keep)
                self.compiled[key] = (compiled, extra + self._constexpr_tail(len(args) + len(extra), constexprs),
                                      key[0])              # (key[0]: the device)
            return None
        self._launch(entry, grid, args)
        return entry

    @staticmethod
    def _key(args, constexprs) -> tuple:
        """(device, constexprs, runtime arguments' specialization): what selects a compiled kernel."""
        return (torch.cuda.current_device(), tuple((name, type(value), value) for name, value in constexprs.items()),
                tuple(map(_arg_specialization, args)))

    def _args_from_ptx(self, key, grid, args, constexprs) -> tuple:
        """The trailing runtime arguments that ptx_args reads from the PTX of the variant that key selects."""
        extra = self.from_ptx.get(key)
        if extra is None:
            placeholders = (0, ) * (sum(not param.is_constexpr for param in self.kernel.params) - len(args))
            ptx = self.kernel.warmup(*args, *placeholders, grid=grid, **constexprs).asm["ptx"]
            extra = self.from_ptx[key] = tuple(self.ptx_args(ptx, constexprs))
        return extra

    def run(self, entry, grid, args: tuple, constexprs: dict):
        """Launch again from an entry that __call__ returned, skipping its key: for callers that keep the entry per
        call signature (a launch plan) and vouch that ``args`` specialize as those it was made for did (the same
        ints, tensor dtypes and alignments, descriptor blocks and layouts). Falls back to __call__ when there is no
        entry yet or triton's own path is needed. Returns the entry to pass next time."""
        if entry is None or _plain_launch_needed(self.kernel):
            return self(grid, *args, **constexprs)
        self._launch(entry, grid, args)
        return entry

    @staticmethod
    def _launch(entry, grid, args):
        compiled, tail, device = entry
        stream = torch._C._cuda_getCurrentRawStream(device)
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                     compiled.function, compiled.packed_metadata, None, None, None, *args, *tail)

    def _constexpr_tail(self, n_args: int, constexprs: dict) -> tuple:
        """The values of the signature's parameters after the positional ones, in order (triton's launcher takes
        every parameter, constexprs included); defaults where not given."""
        tail = []
        for param in self.kernel.params[n_args:]:
            if param.name in constexprs:
                tail.append(constexprs[param.name])
            elif param.default is not inspect.Parameter.empty:
                tail.append(param.default)
            else:
                raise TypeError(f"LaunchCache({self.kernel.__name__}): parameter {param.name!r} was not passed; "
                                "runtime arguments go positionally, constexprs by name")
        return tuple(tail)


class Launch:
    """One kernel launch with its grid and constexprs fixed, its LaunchCache entry kept: ``launch(*args)``. Part of a
    launch plan (PlanCache), which vouches that every call passes arguments that specialize alike (LaunchCache.run).

    ``descriptors``: the geometry ``(shape, strides, block shape, shared-memory layout)`` of the kernel's leading
    parameters, host-side tensor descriptors over tensors the plan has checked for TMA; a call passes the tensors in
    their place. Once the direct launch runs, those go through EncodedLaunch: their encodings kept per address
    (``encoded``: None until the first direct launch, False where EncodedLaunch does not apply, asked once)."""

    __slots__ = ("cache", "grid", "constexprs", "entry", "descriptors", "encoded")

    def __init__(self, cache: LaunchCache, grid: tuple, descriptors=(), **constexprs):
        self.cache, self.grid, self.constexprs, self.entry = cache, grid, constexprs, None
        self.descriptors, self.encoded = tuple(descriptors), None

    def __call__(self, *args):
        if self.encoded and not _plain_launch_needed(self.cache.kernel):
            self.encoded(args)
            return
        n = len(self.descriptors)
        if n:
            bind_cuda_context()
            args = tuple(host_descriptor(t, *geometry) for t, geometry in zip(args, self.descriptors)) + args[n:]
        self.entry = self.cache.run(self.entry, self.grid, args, self.constexprs)
        if n and self.entry is not None and self.encoded is None:
            self.encoded = EncodedLaunch.of(self.entry, self.grid, self.descriptors) or False


class EncodedLaunch:
    """A direct launch whose leading arguments are host-side tensor descriptors, encoded once per tensor address.

    triton 3.6's launcher wraps its C launch in Python that turns each descriptor into a CUtensorMap on every launch
    (``make_tensordesc_arg``: a driver call, cuTensorMapEncodeTiled, plus list building). The encoding depends only on
    the address, the geometry and the kernel's swizzle / block (fixed per plan and compiled kernel), so this keeps it
    per descriptor and address (a few addresses each: the caching allocator hands the same blocks back in a loop),
    and calls the C launch itself, as the wrapper would. ``of`` returns None where the launcher is not the one this
    was written against (then the wrapper runs)."""

    __slots__ = ("launch", "grid", "device", "function", "flags", "packed_metadata", "tail", "fixed", "cache")

    MAX_ADDRESSES = 16          # per descriptor; past it that descriptor's encodings start over

    @classmethod
    def of(cls, entry, grid, descriptors):
        compiled, tail, device = entry
        launcher = compiled.run
        launch = _c_launch(launcher, len(descriptors))
        metas = getattr(compiled.metadata, "tensordesc_meta", None)
        if (launch is None or not metas or len(metas) != len(descriptors) or getattr(launcher, "num_ctas", 1) != 1
                or launcher.global_scratch_size or launcher.profile_scratch_size
                or any(meta is None or meta["fp4_padded"] for meta in metas)):
            return None
        self = cls.__new__(cls)
        self.launch, self.device, self.tail = launch, device, tail
        self.grid = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        self.function, self.packed_metadata = compiled.function, compiled.packed_metadata
        self.flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
        host_type = _tma_host_types()
        self.fixed = [(meta["swizzle"], meta["elem_size"], host_type[meta["elem_type"]], meta["block_size"], shape,
                       strides) for meta, (shape, strides, _, _) in zip(metas, descriptors)]
        self.cache = [{} for _ in descriptors]
        return self

    def __call__(self, args):
        encoded = []
        for i, cache in enumerate(self.cache):
            address = args[i].data_ptr()
            arguments = cache.get(address)
            if arguments is None:
                arguments = self._encode(i, address)
            encoded += arguments
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        # The C launch's leading arguments (triton 3.6's _BASE_ARGS_FORMAT "iiiKKppOOOOOO"): grid x, y, z, stream,
        # function, cooperative, PDL, global scratch, profile scratch, packed metadata, launch metadata, enter and exit
        # hooks; then the kernel's parameters, each descriptor as its encoding.
        self.launch(*self.grid, stream, self.function, *self.flags, None, None, self.packed_metadata, None, None, None,
                    *encoded, *args[len(self.cache):], *self.tail)

    def _encode(self, i, address):
        """The descriptor's launcher arguments, as make_tensordesc_arg gives them: CUtensorMap, shape, strides."""
        swizzle, elem_size, host_type, block, shape, strides = self.fixed[i]
        bind_cuda_context()
        cache = self.cache[i]
        if len(cache) >= self.MAX_ADDRESSES:
            cache.clear()
        tensor_map = _fill_tma_descriptor()(address, swizzle, elem_size, host_type, block, shape, strides, 0)
        arguments = cache[address] = (tensor_map, *shape, *strides)
        return arguments


def _c_launch(launcher, n_descriptors: int):
    """The C launch below triton 3.6's descriptor wrapper (``wrap_handle_tensordesc``'s closure), where the kernel's
    descriptors are its first ``n_descriptors`` parameters; None for any other shape of launcher."""
    inner = getattr(launcher, "launch", None)
    names = getattr(getattr(inner, "__code__", None), "co_freevars", ())
    if not {"launcher", "tensordesc_indices"} <= set(names) or inner.__closure__ is None:
        return None
    cells = dict(zip(names, (cell.cell_contents for cell in inner.__closure__)))
    if sorted(cells["tensordesc_indices"]) != list(range(n_descriptors)):
        return None
    return cells["launcher"]


def _fill_tma_descriptor():
    return triton.runtime.driver.active.utils.fill_tma_descriptor


def _tma_host_types():
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    return TMA_DTYPE_DEVICE_TO_HOST


def host_descriptor(base, shape, strides, block_shape, layout):
    """A host-side (Gluon) TensorDescriptor without its constructor's checks (~4 us each, up to nine per call, measured
    as host time at short sequences: session 16). The launchers have checked what they check (16-byte aligned base and
    strides, unit last stride; power-of-two boxes) before coming here."""
    desc = _GluonDescriptor.__new__(_GluonDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.layout, desc.padding = (
        base, shape, strides, block_shape, layout, "zero")
    return desc


def bind_cuda_context():
    """triton encodes host-side descriptors before its launcher binds the CUDA context to the calling thread,
    and a new thread has none yet ("invalid device context"): any CUDA runtime call binds it, and this one is
    also legal while a CUDA graph is being captured."""
    torch.cuda.is_current_stream_capturing()


def launch_device() -> int:
    """The device a launch goes to, which launch plans key on: the current CUDA device (-1 in the interpreter)."""
    return -1 if INTERPRET else torch.cuda.current_device()


class PlanCache:
    """Launch plans per call signature: ``plans.get(key, make)`` returns the plan made for ``key`` (shapes, strides,
    dtypes, alignments, options, config, device: whatever the plan derives anything from), calling ``make()`` the
    first time. A plan keeps what a launcher would otherwise re-derive on every call (configs, grids, descriptor
    geometry, constexprs, LaunchCache's key), which is host time that short calls are bound by (benchmarks/NOTES.md,
    session 23). Bounded: past ``maxsize`` signatures (e.g. growing decode lengths) it starts over."""

    def __init__(self, maxsize: int = 512):
        self.plans, self.maxsize = {}, maxsize

    def get(self, key, make):
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= self.maxsize:
                self.plans.clear()
            plan = self.plans[key] = make()
        return plan


def _plain_launch_needed(kernel) -> bool:
    """Whether anything must see every launch through triton's own path: launch hooks (profilers), the kernel's
    pre-run hooks, or a debug / instrumentation mode (they change what gets compiled)."""
    return (bool(getattr(kernel, "pre_run_hooks", None)) or knobs.runtime.debug
            or bool(knobs.compilation.instrumentation_mode)
            or any(hook is not None and getattr(hook, "calls", True)
                   for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)))
