"""Greedy generation for Llama-family Hugging Face models on a paged KV cache, each decode step one CUDA graph.

The serving path of ``flash_attn_with_kvcache`` end to end (issue 6's demo; ``flashfuse bench decode``
times it against HF ``generate`` with a static cache):

- ``PagedKVCache``: per layer a pool of pages (num_pages, page_size, nheads_k, headdim), a block table
  giving each sequence its pages (shuffled, to show that nothing assumes them contiguous), and the lengths.
- ``Generator(model, batch, max_seqlen)``: runs the model's own weights through flashfuse ops. A layer is
      h = rms_norm(x);  q, k, v = h Wq, h Wk, h Wv
      a = flash_attn_with_kvcache(q, cache, k, v, rotary, causal)     (appends k, v; rotates q and k)
      h, x = rms_norm(a Wo, residual=x);  x = x + (silu(h Wg) * h Wu) Wd
  The prompt (prefill) runs eagerly with seqlen_q = prompt length; every decode step is one captured
  CUDA graph whose replay embeds the last token, runs the layers, appends to the cache, takes the argmax
  and writes it both to the output buffer and to the next step's input, so a whole generation is N graph
  replays and a single host synchronisation at the end (no per-token Python, no per-token sync).

Supported: ``LlamaForCausalLM``, ``MistralForCausalLM`` (sliding window as a (window - 1, 0) window) and
``Qwen2ForCausalLM`` (q/k/v biases), SiLU MLPs, any rope scaling HF expresses through its rotary module's
``inv_freq`` and ``attention_scaling``. Greedy decoding, no stop tokens: every sequence gets ``max_new_tokens``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .ops._triton import cdiv
from .ops.attention.decode import decode_config, num_splits_heuristic
from .ops.attention.kvcache import flash_attn_with_kvcache
from .ops.glu import swiglu
from .ops.norm import rms_norm

SUPPORTED = ("llama", "mistral", "qwen2")


class PagedKVCache:
    """Keys and values of ``num_layers`` layers for ``batch`` sequences of up to ``max_seqlen`` tokens, in
    pages of ``page_size`` (a power of two) positions. ``block_table`` (batch, pages per sequence) int32
    maps each sequence's logical pages to physical ones; ``seqlens`` (batch,) int32 counts the tokens held."""

    def __init__(self, num_layers: int, batch: int, max_seqlen: int, nheads_k: int, head_dim: int, *,
                 dtype: torch.dtype, device, page_size: int = 16, seed: int = 0):
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page_size is {page_size}; supported: a power of two (16, 64, 256, ...)")
        pages_per_seq = cdiv(max_seqlen, page_size)
        num_pages = batch * pages_per_seq
        shape = (num_pages, page_size, nheads_k, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.block_table = order.view(batch, pages_per_seq).to(device=device, dtype=torch.int32)
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.page_size, self.max_seqlen = page_size, pages_per_seq * page_size

    def reset(self) -> None:
        self.seqlens.zero_()


def _family(model) -> str:
    kind = getattr(model.config, "model_type", None)
    if kind not in SUPPORTED:
        raise ValueError(f"model_type is {kind!r}; Generator supports {', '.join(SUPPORTED)} (Llama-family "
                         "decoders with a SiLU-gated MLP)")
    if getattr(model.config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act is {model.config.hidden_act!r}; Generator supports 'silu'")
    if kind == "qwen2" and getattr(model.config, "use_sliding_window", False):
        raise ValueError("use_sliding_window is True (a window on some layers only, by max_window_layers); "
                         "Generator supports Qwen2 without sliding windows")
    return kind


class Generator:
    """``Generator(model, batch, max_seqlen, page_size=16, cuda_graph=True)``, then
    ``generate(input_ids (batch, prompt_len), max_new_tokens) -> (batch, max_new_tokens)`` token ids.

    The model's parameters are used in place (nothing is copied); the cache and the graph are built once
    for this batch size and reused by every ``generate`` call. ``cuda_graph=False`` runs decode steps
    eagerly (the CPU path, and for debugging)."""

    def __init__(self, model, batch: int, max_seqlen: int, *, page_size: int = 16, cuda_graph: bool = True):
        _family(model)
        cfg, inner = model.config, model.model
        self.model, self.batch = model, batch
        self.nheads_q, self.nheads_k = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        self.window = (window - 1, 0) if window else (-1, -1)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = PagedKVCache(len(inner.layers), batch, max_seqlen, self.nheads_k, self.head_dim,
                                  dtype=self.dtype, device=self.device, page_size=page_size)
        # HF's rotary module: cos/sin of position x inv_freq, times attention_scaling (llama3/yarn scaling
        # live in inv_freq and the scaling). flash-attn's tables hold the rotary_dim / 2 distinct values.
        rotary = inner.rotary_emb
        positions = torch.arange(self.cache.max_seqlen, device=self.device, dtype=torch.float32)
        freqs = torch.outer(positions, rotary.inv_freq.to(device=self.device, dtype=torch.float32))
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (freqs.cos() * scaling).to(self.dtype)
        self.sin = (freqs.sin() * scaling).to(self.dtype)
        # Decode steps use one split count, chosen for the full cache: the graph cannot read the lengths
        # on the host, and eager steps then round exactly like the graph's. The prefill chooses its own.
        group = self.nheads_q // self.nheads_k
        block = decode_config(max(16, self.head_dim), group)
        self.decode_splits = num_splits_heuristic(self.device, batch, self.nheads_k, cdiv(group, block["BLOCK_M"]),
                                                  self.cache.max_seqlen, block["BLOCK_N"])
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        self._graph, self._capacity = None, 0

    # -- the model --------------------------------------------------------------------------------------
    def _layer(self, i: int, layer, x: Tensor) -> Tensor:
        batch, seqlen, _ = x.shape
        attn, mlp = layer.self_attn, layer.mlp
        h = rms_norm(x, layer.input_layernorm.weight, self.eps)
        q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(batch, seqlen, self.nheads_q, self.head_dim)
        k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(batch, seqlen, self.nheads_k, self.head_dim)
        v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(batch, seqlen, self.nheads_k, self.head_dim)
        a = flash_attn_with_kvcache(q, self.cache.k[i], self.cache.v[i], k, v, rotary_cos=self.cos,
                                    rotary_sin=self.sin, cache_seqlens=self.cache.seqlens,
                                    block_table=self.cache.block_table, causal=True, window_size=self.window,
                                    rotary_interleaved=False, num_splits=self.decode_splits if seqlen == 1 else 0)
        a = F.linear(a.view(batch, seqlen, -1), attn.o_proj.weight, attn.o_proj.bias)
        h, x = rms_norm(a, layer.post_attention_layernorm.weight, self.eps, residual=x)
        up = swiglu(F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias), F.linear(h, mlp.up_proj.weight,
                                                                                  mlp.up_proj.bias))
        return x + F.linear(up, mlp.down_proj.weight, mlp.down_proj.bias)

    def _next_tokens(self, tokens: Tensor) -> Tensor:
        """tokens (batch, seqlen) appended to the cache; returns the greedy next token (batch,) int64."""
        inner = self.model.model
        x = inner.embed_tokens(tokens)
        for i, layer in enumerate(inner.layers):
            x = self._layer(i, layer, x)
        self.cache.seqlens += tokens.shape[1]
        x = rms_norm(x[:, -1], inner.norm.weight, self.eps)
        return self.model.lm_head(x).argmax(dim=-1)

    # -- decoding ---------------------------------------------------------------------------------------
    def _decode_step(self) -> None:
        """One token for every sequence: reads self._tokens (batch, 1), writes the output column self._step."""
        nxt = self._next_tokens(self._tokens)
        self._out.scatter_(1, self._step.expand(self.batch, 1), nxt[:, None])
        self._tokens.copy_(nxt[:, None])
        self._step += 1

    def _prepare(self, max_new_tokens: int) -> None:
        """Static buffers for up to ``max_new_tokens`` and, on CUDA, the decode graph over them (captured
        after a warm-up step on a side stream, which compiles every kernel outside the capture)."""
        self._tokens = torch.zeros(self.batch, 1, dtype=torch.long, device=self.device)
        self._out = torch.zeros(self.batch, max_new_tokens, dtype=torch.long, device=self.device)
        self._step = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self._capacity = max_new_tokens
        if not self.cuda_graph:
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            self._decode_step()
        torch.cuda.current_stream().wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph), torch.no_grad():
            self._decode_step()

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int) -> Tensor:
        """input_ids (batch, prompt_len) int -> the next ``max_new_tokens`` greedy tokens (batch, max_new_tokens)."""
        if input_ids.dim() != 2 or input_ids.shape[0] != self.batch:
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; expected ({self.batch}, prompt_len)"
                             " (the batch this Generator was built for)")
        total = input_ids.shape[1] + max_new_tokens
        if max_new_tokens < 1 or total > self.cache.max_seqlen:
            raise ValueError(f"prompt_len + max_new_tokens is {total}; supported: max_new_tokens >= 1 and at "
                             f"most max_seqlen = {self.cache.max_seqlen} tokens in all")
        if self._capacity < max_new_tokens:
            self._prepare(max_new_tokens)
        self.cache.reset()
        first = self._next_tokens(input_ids.to(self.device))          # prefill
        self._out.zero_()
        self._out[:, 0] = first
        self._tokens.copy_(first[:, None])
        self._step.fill_(1)
        for _ in range(max_new_tokens - 1):
            if self._graph is not None:
                self._graph.replay()
            else:
                self._decode_step()
        return self._out[:, :max_new_tokens].clone()
