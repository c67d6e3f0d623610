"""A patch_transformers-patched Llama trains under DDP and FSDP2 (fully_shard) as it does in one process
(CPU tier: 2 gloo processes, fp32, the kernels in Triton's interpreter).

One spawn of 2 ranks runs every distributed case (each spawn re-imports torch and transformers: ~10 s). Each rank
takes half of a fixed global batch whose masked labels are spread unevenly over the ranks, normalizes its loss by
the global target count (`num_items_in_batch`) and runs 3 AdamW steps. The parent trains an identically
initialised patched model on the whole batch in one process and compares, for every case and both ranks: the
per-step loss (summed over ranks), every parameter's gradient after the first backward, and every parameter
after the last step. Cases:

- ``ddp``: patch, then DistributedDataParallel;
- ``ddp-wrapped-first``: DistributedDataParallel, then patch ``ddp.module`` (DDP keeps the Parameter objects);
- ``fsdp2``: patch, then ``fully_shard_transformer`` (fully_shard per decoder layer, then the root); a forward
  pre-hook records that the flashfuse norms get plain tensors, not DTensors, from FSDP;
- ``fsdp2-sharded-first``: fully_shard, then patch: refused with a ValueError (the swapped norms would keep the
  sharded DTensor; the reason is in training.py's docstring).

Children write their results with torch.save and re-raise any exception, which mp.spawn turns into an exception
in the parent; the assertions all run in the parent.
"""

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from flashfuse.integrations import unpatch_transformers
from flashfuse.nn import RMSNorm

from flashfuse.distributed.training import (NVLS_OFF_ENV, disable_nvlink_multicast, fully_shard_transformer,
                                            num_items_in_batch)
from testing import rel_err, spawn_nvls_off  # noqa: E402

WORLD = 2
STEPS = 3
LR = 1e-2
# Llama-3.2-1B's structure at test size: GQA (4 query / 2 KV heads), tied embeddings (under FSDP2 the shared
# weight lives in the root unit with the lm_head the fused loss reads). fp32: exact enough to compare tightly.
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BATCH, SEQ = 4, 9  # global batch; each rank takes BATCH // WORLD rows
CASES = ("ddp", "ddp-wrapped-first", "fsdp2", "fsdp2-sharded-first")

# Tolerances (fp32). The distributed and single-process runs compute the same math on different row blocks: the
# half-batch sums plus the all-reduce change only the summation order (fp32 ulps, ~1e-7 per reduction). Measured
# here (all three cases give bit-identical results to each other): losses 5.5e-7, first-step gradients 5.6e-7.
# Parameters after 3 steps: 1.3e-5 at most, in one tensor, because AdamW's per-element step
# lr * m / (sqrt(v) + eps) is sensitive to rounding where the gradient is near its eps (1e-8): one down_proj entry
# with |g| = 2.5e-8 moves 1e-4 (1% of lr) differently; all other tensors agree to ~2e-6. So losses and gradients
# are held to 1e-5 (20x margin) and parameters to 1e-4 (8x). A wrong gradient average (x2: 0.5 relative error
# in the gradients), a missing all-reduce or a rank training on the wrong rows fail by orders of magnitude.
LOSS_TOL, GRAD_TOL, PARAM_TOL = 1e-5, 1e-5, 1e-4


def build_model():
    import transformers

    from flashfuse.integrations import patch_transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    with torch.no_grad():  # norms not all ones: a wrong norm weight (e.g. a DTensor shard) would show
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model, patch_transformers


def global_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, CONFIG["vocab_size"], (BATCH, SEQ), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100  # a masked prompt in rank 0's half only: the ranks hold 12 and 16 target tokens
    labels[1, 6] = -100
    return ids, labels


def full(t):
    from torch.distributed.tensor import DTensor
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train(model, params, ids, labels, world=1):
    """STEPS AdamW steps; returns the per-step global losses, the first step's gradients and final parameters.
    In a distributed run `ids` / `labels` are this rank's half and the loss is sum / global count (x world for
    backward: DDP and FSDP2 average the gradients over ranks)."""
    opt = torch.optim.AdamW(params, lr=LR)
    module = model.module if isinstance(model, DDP) else model
    losses, grads = [], None
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        if world == 1:
            loss = model(ids, labels=labels).loss  # HF's own mean over the target tokens
            loss.backward()
        else:
            out = model(ids, labels=labels, num_items_in_batch=num_items_in_batch(labels))
            assert out.logits is None  # the fused linear cross entropy ran (a fallback would give logits)
            loss = out.loss
            (loss * world).backward()
            loss = loss.detach().clone()
            dist.all_reduce(loss)
        losses.append(loss.item())
        if step == 0:
            grads = {n: full(p.grad) for n, p in module.named_parameters()}
        opt.step()
    return losses, grads, {n: full(p) for n, p in module.named_parameters()}


def _run_case(case, rank, ids, labels):
    model, patch = build_model()
    model.train()
    seen = set()
    if case == "ddp":
        model = DDP(patch(model))
    elif case == "ddp-wrapped-first":
        model = DDP(model)
        patch(model.module)
    elif case == "fsdp2":
        fully_shard_transformer(patch(model))
        try:
            fully_shard_transformer(model)
        except ValueError as e:
            seen.add(f"again: {e}")
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.register_forward_pre_hook(lambda mod, args: seen.add(type(mod.weight).__name__))
    else:  # fsdp2-sharded-first
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        try:
            patch(model)
        except ValueError as e:
            return {"error": str(e)}
        return {"error": None}
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    losses, grads, params = train(model, model.parameters(), ids[half], labels[half], world=WORLD)
    return {"losses": losses, "grads": grads, "params": params, "weight_types": sorted(seen)}


def _worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ids, labels = global_batch()
        results = {case: _run_case(case, rank, ids, labels) for case in CASES}
        results["env"] = {k: os.environ.get(k) for k in NVLS_OFF_ENV}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The distributed runs (both ranks' results) and the single-process reference."""
    tmp = tmp_path_factory.mktemp("dist")
    spawn_nvls_off(_worker, (str(tmp / "init"), str(tmp)), WORLD)
    ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    model, patch = build_model()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    patch(model).train()
    ids, labels = global_batch()
    reference = train(model, model.parameters(), ids, labels)
    unpatch_transformers(model)  # the rope rebinding is process-wide: give it back
    return ranks, reference, init


@pytest.mark.parametrize("case", ["ddp", "ddp-wrapped-first", "fsdp2"])
def test_matches_single_process(runs, case):
    ranks, (ref_losses, ref_grads, ref_params), init = runs
    assert ref_losses[-1] < ref_losses[0]  # it trains, and every parameter moved far past the tolerance
    assert all(rel_err(ref_params[n], p) > 100 * PARAM_TOL for n, p in init.items())
    for rank, results in enumerate(ranks):
        losses, grads, params = (results[case][k] for k in ("losses", "grads", "params"))
        assert len(losses) == STEPS
        for step, (loss, ref) in enumerate(zip(losses, ref_losses)):
            assert abs(loss - ref) <= LOSS_TOL * abs(ref), (rank, step, loss, ref)
        assert grads.keys() == ref_grads.keys() and params.keys() == ref_params.keys()
        for name, ref in ref_grads.items():
            assert rel_err(grads[name], ref) < GRAD_TOL, (rank, name)
        for name, ref in ref_params.items():
            assert rel_err(params[name], ref) < PARAM_TOL, (rank, name)


def test_fsdp2_gives_flashfuse_plain_tensors(runs):
    """In forward FSDP2 hands the flashfuse norms the unsharded plain Parameter (never the DTensor shard);
    sharding a sharded model again is refused; the children ran with NVLink multicast off."""
    ranks = runs[0]
    for results in ranks:
        seen = results["fsdp2"]["weight_types"]
        assert [t for t in seen if not t.startswith("again")] == ["Parameter"]
        assert any("already has DTensor parameters" in t for t in seen)
        assert results["env"] == NVLS_OFF_ENV


def test_fsdp2_patch_after_shard_fails(runs):
    ranks = runs[0]
    for results in ranks:
        assert "already sharded" in results["fsdp2-sharded-first"]["error"]
        assert "patch_transformers before fully_shard" in results["fsdp2-sharded-first"]["error"]


def test_num_items_in_batch_counts_shifted_targets():
    labels = torch.tensor([[-100, -100, 5, 6, 7], [1, 2, -100, 4, 9]])
    assert num_items_in_batch(labels).item() == 3 + 3  # targets are labels[:, 1:]
    assert num_items_in_batch(labels, ignore_index=9).item() == 4 + 3
    assert num_items_in_batch(labels).dtype == torch.int64
    with pytest.raises(ValueError, match=r"labels must be a \(batch, seqlen\) tensor, got Tensor \(5,\)"):
        num_items_in_batch(labels[0])


def test_helpers_env_and_errors():
    env = {"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"}
    assert disable_nvlink_multicast(env) is env
    assert env == {"PATH": "/bin", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                   "NVSHMEM_DISABLE_NVLS": "1"}
    with pytest.raises(ValueError, match="Sequential names no decoder-layer class in _no_split_modules"):
        fully_shard_transformer(nn.Sequential(nn.Linear(2, 2)))
