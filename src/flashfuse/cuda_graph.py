"""CUDA-graph replay of an inference callable: ``cuda_graph(unet)`` runs a whole model call as one graph launch.

Why: a diffusion UNet or DiT call is ~1000 small kernels; on a slow host the Python that launches them takes
longer than the GPU work (SD-1.5 UNet, batch 2, 64x64 latents on an H200: 22 ms of eager wall time for 12 ms
of kernels; patched with flashfuse, 45 ms for 11 ms). A CUDA graph records the launches once and replays them
with one host call.

How (the protocol of ``torch.cuda.graphs``, wrapped for repeated use):
- Each distinct call signature -- the pytree structure of the arguments, every tensor's shape, stride, dtype
  and device, and every non-tensor argument's value -- gets its own graph, captured on first use after
  ``warmup`` eager calls on a side stream (cuBLAS / Triton / autotuning choose their kernels there).
- A call copies its tensor arguments into that graph's static input buffers, replays, and returns the outputs
  (cloned unless ``clone_outputs=False``: without clones, the next replay overwrites what the last returned).
- All graphs of one wrapper share a memory pool.

Rules of the road (as for any CUDA graph): inference only (calls run under ``torch.no_grad``); the callable must
not synchronise with the host or allocate from the CPU side (no ``.item()``, no data-dependent shapes); module
parameters are read in place, so in-place weight updates are seen, reassigned parameters are not; in-place
updates of the *arguments* inside the callable happen on the static copies, not on the caller's tensors.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

__all__ = ["cuda_graph", "CUDAGraphed"]


class _Captured:
    """One signature's graph: static inputs, the output pytree (static), and the graph."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[torch.Tensor], output: Any):
        self.graph, self.inputs, self.output = graph, inputs, output


def _signature(leaves: list, spec) -> tuple:
    """Hashable key of a call: structure, tensor metadata, non-tensor values (which the graph bakes in)."""
    parts = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            parts.append(("T", tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device))
        else:
            try:
                hash(leaf)
            except TypeError:
                raise TypeError(f"argument leaf {i} is a {type(leaf).__name__}, which is not hashable; cuda_graph "
                                "accepts tensors and hashable constants (ints, floats, strings, None)") from None
            parts.append(("C", leaf))
    try:
        hash(spec)
    except TypeError:      # older TreeSpecs with list contexts
        spec = repr(spec)
    return (spec, tuple(parts))


class CUDAGraphed(torch.nn.Module):
    """``fn`` (a module or any callable) replayed as CUDA graphs, one per call signature.

    Attribute access falls through to the wrapped module (``graphed.config``, ``graphed.dtype`` of a diffusers
    model keep working).
    """

    def __init__(self, fn: Callable, *, warmup: int = 2, clone_outputs: bool = True):
        super().__init__()
        if not callable(fn):
            raise TypeError(f"fn is a {type(fn).__name__}; cuda_graph needs a callable (an nn.Module or a function)")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup is {warmup!r}; supported: an int >= 1 (eager calls before capture)")
        # A module is registered (its parameters stay visible to .parameters(), .to(), state_dict()).
        if isinstance(fn, torch.nn.Module):
            self.module = fn
        else:
            self._fn = fn
        self.warmup, self.clone_outputs = warmup, clone_outputs
        self._graphs: dict[tuple, _Captured] = {}
        self._pool = None

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module" or "module" not in self._modules:
                raise
            return getattr(self._modules["module"], name)

    @property
    def num_graphs(self) -> int:
        """How many signatures have been captured."""
        return len(self._graphs)

    def reset(self) -> None:
        """Drop every captured graph (e.g. after reassigning parameters); the next calls capture anew."""
        self._graphs.clear()
        self._pool = None

    def _call(self, *args, **kwargs):
        return (self.module if "module" in self._modules else self._fn)(*args, **kwargs)

    def _capture(self, key, leaves, spec) -> _Captured:
        device = next(leaf.device for leaf in leaves if isinstance(leaf, torch.Tensor))
        static = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        args, kwargs = pytree.tree_unflatten(static, spec)
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self._call(*args, **kwargs)
            torch.cuda.current_stream().wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                output = self._call(*args, **kwargs)
        for leaf in pytree.tree_leaves(output):
            if not isinstance(leaf, (torch.Tensor, int, float, bool, str, type(None))):
                raise TypeError(f"the callable returned a {type(leaf).__name__} inside its output; cuda_graph "
                                "returns tensors (in tuples, lists, dicts or registered pytree classes) and constants")
        inputs = [t for t in static if isinstance(t, torch.Tensor)]
        captured = _Captured(graph, inputs, output)
        self._graphs[key] = captured
        return captured

    def forward(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        if not tensors:
            raise ValueError("cuda_graph: the call has no tensor arguments; nothing to feed a graph")
        for i, t in enumerate(tensors):
            if t.device.type != "cuda":
                raise ValueError(f"cuda_graph: tensor argument {i} is on {t.device}; CUDA graphs need CUDA tensors")
            if t.device != tensors[0].device:
                raise ValueError(f"cuda_graph: tensor arguments on {tensors[0].device} and {t.device}; "
                                 "supported: one device")
        key = _signature(leaves, spec)
        with torch.no_grad():
            captured = self._graphs.get(key)
            if captured is None:
                captured = self._capture(key, leaves, spec)
            for dst, src in zip(captured.inputs, tensors):
                dst.copy_(src)
            captured.graph.replay()
            if not self.clone_outputs:
                return captured.output
            return pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, captured.output)


def cuda_graph(fn: Callable, *, warmup: int = 2, clone_outputs: bool = True) -> CUDAGraphed:
    """Wrap an inference callable (an ``nn.Module`` or a function of tensors) so that each call replays a CUDA
    graph instead of launching its kernels one by one from Python.

    Args:
        fn: the model or function. Its tensor arguments may be nested in tuples, lists and dicts; other
            arguments must be hashable (they become part of the graph's key, e.g. ``return_dict=False``).
        warmup: eager calls on a side stream before each capture (autotuners and cuBLAS settle there).
        clone_outputs: return clones of the graph's static outputs (default). ``False`` returns the static
            tensors themselves: faster, but the next call overwrites them.

    Returns:
        ``CUDAGraphed``: an ``nn.Module`` whose call has ``fn``'s signature; ``num_graphs`` counts the captured
        signatures and ``reset()`` drops them.

    Example (a diffusers UNet, one graph per latent shape; docs/diffusion-kernels.md graphs a whole denoising
    step with FusedScheduler)::

        unet = flashfuse.cuda_graph(flashfuse.patch_diffusers(unet))
        eps = unet(latents, t, encoder_hidden_states=text).sample      # t: a 0-dim tensor on the GPU
    """
    return CUDAGraphed(fn, warmup=warmup, clone_outputs=clone_outputs)
