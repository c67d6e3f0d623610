"""torch.compile over a patched Llama wrapped in DDP or FSDP2 on 2 GPUs trains as the eager single-GPU model.

GPU tier, 2 GPUs (device kind nvidia-h200-x2). The setup of tests/test_distributed_training_gpu.py (4 decoder
layers of Llama-3.2-1B width, bf16, seed 0; a global batch of 4 x 1024 tokens with a masked prompt on rank 0;
per-rank loss over the global target count, times the world size before backward), with the wrapped model
compiled the way each wrapper's docs recommend:

- ``ddp-compile``: ``torch.compile(DDP(patched))`` (Dynamo's DDPOptimizer splits the graph at the buckets);
- ``fsdp2-compile``: ``fully_shard_transformer(patched)``, then ``torch.compile`` of each decoder layer (the
  torchtitan recipe: FSDP2's hooks stay outside the compiled layers).

3 fused-AdamW steps each; every rank compares the per-step loss (summed over ranks), the first step's gradients
and the final parameters with the eager single-GPU reference it computes itself; the parent asserts.
"""

import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from flashfuse.distributed import NVLS_OFF_ENV, fully_shard_transformer, num_items_in_batch
from testing import rel_err, spawn_and_read_json, write_rank_json  # noqa: E402
from test_distributed_training_gpu import (BATCH, GRAD_TOL, LOSS_TOL, LR, PARAM_TOL, STEPS, build_model,  # noqa: E402
                                           global_batch)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multigpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (device kind nvidia-h200-x2)"),
]

WORLD = 2
CASES = ("ddp-compile", "fsdp2-compile")


def _full(t):
    from torch.distributed.tensor import DTensor
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().clone()


def _train(call, params: dict, ids, labels, world: int):
    """STEPS steps of ``call(ids, labels, n) -> loss``; the per-step global losses, first gradients, last params."""
    opt = torch.optim.AdamW(params.values(), lr=LR, fused=True)
    losses, grads = [], None
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = call(ids, labels, num_items_in_batch(labels) if world > 1 else None)
        (loss * world).backward()
        loss = loss.detach().float()
        if world > 1:
            dist.all_reduce(loss)
        losses.append(loss.item())
        if step == 0:
            grads = {n: _full(p.grad) for n, p in params.items()}
        opt.step()
    return losses, grads, {n: _full(p) for n, p in params.items()}


def _worker(rank, init_file, out_dir):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            device_id=device)
    try:
        ids, labels = global_batch(device)
        half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        model = build_model(device).train()
        ref = _train(lambda i, lab, n: model(i, labels=lab).loss, dict(model.named_parameters()), ids, labels, 1)
        del model
        result = {"env": {k: os.environ.get(k) for k in NVLS_OFF_ENV}}
        for case in CASES:
            model = build_model(device).train()
            params = dict(model.named_parameters())       # the names and objects before any wrapping
            if case == "ddp-compile":
                wrapped = torch.compile(DDP(model, device_ids=[rank]))
            else:
                fully_shard_transformer(model)
                params = dict(model.named_parameters())   # now DTensors, same names
                for layer in model.model.layers:
                    layer.compile()
                wrapped = model
            run = _train(lambda i, lab, n: wrapped(i, labels=lab, num_items_in_batch=n).loss, params,
                         ids[half], labels[half], WORLD)
            (losses, grads, final), (ref_losses, ref_grads, ref_params) = run, ref
            result[case] = dict(
                losses=losses,
                loss=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                grad=max(rel_err(grads[n], ref_grads[n]) for n in ref_grads),
                param=max(rel_err(final[n], ref_params[n]) for n in ref_params),
                same_names=sorted(grads) == sorted(ref_grads))
            del model, wrapped, params, run
            torch.cuda.empty_cache()
        write_rank_json(out_dir, rank, result)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn_and_read_json(_worker, tmp_path_factory.mktemp("dist_compile_gpu"), WORLD)


@pytest.mark.parametrize("case", CASES)
def test_compiled_wrapped_model_matches_single_gpu(results, case):
    for rank, r in enumerate(results):
        assert r["env"] == NVLS_OFF_ENV
        errors = r[case]
        assert errors["same_names"]
        assert errors["loss"] < LOSS_TOL, (rank, errors)
        assert errors["grad"] < GRAD_TOL, (rank, errors)
        assert errors["param"] < PARAM_TOL, (rank, errors)
