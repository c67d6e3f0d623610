"""Context-parallel training on 2 GPUs (NCCL, bf16) equals one GPU on the whole sequence.

GPU tier, 2 GPUs (device kind nvidia-h200-x2). A patched Llama of Llama-3.2-1B width (4 decoder layers: hidden
2048, GQA 32/8 heads of 64, 128256-token tied vocabulary, seed 0 as the models suite builds it), one sequence of
16384 tokens with a masked prompt. Every rank first computes the single-GPU reference (the whole sequence, no
collective), then, context parallel over both ranks (zig-zag shards of 8192 tokens, ring attention), one forward
and backward under DDP, under FSDP2, and under FSDP2 with HF's gradient checkpointing (each layer, ring attention
included, runs again in the backward) (``(loss * world).backward()``: both wrappers average gradients over the ranks).
The parent asserts on both ranks' errors: the loss (summed over ranks) and every gradient. Every process runs
with NVLink multicast off (inherited from the parent, checked in the children).
"""

import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from flashfuse.bench.suites.models import LLAMA_1B, _build
from flashfuse.distributed import NVLS_OFF_ENV, context_parallel, context_parallel_shard, fully_shard_transformer
from testing import rel_err, spawn_and_read_json, write_rank_json  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multigpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (device kind nvidia-h200-x2)"),
]

WORLD = 2
SEQ, LAYERS = 16384, 4
CASES = ("ddp", "fsdp2", "fsdp2-checkpointing")
# bf16 weights and gradients, fp32 accumulation in the kernels. The runs differ in rounding: the ring merges
# partial outputs in fp32 but each partial is rounded to bf16 first, each rank's weight gradient is a bf16 sum
# over its half of the tokens that NCCL adds in bf16, the loss sums in another order. Same bounds as the
# data-parallel GPU test (tests/test_distributed_training_gpu.py): the project's per-op bf16 bound for gradients
# (3e-2), 1e-2 relative for the loss. A token at a wrong position or a missing chunk is off by O(1).
LOSS_TOL, GRAD_TOL = 1e-2, 3e-2


def _full(t):
    from torch.distributed.tensor import DTensor
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _worker(rank, init_file, out_dir):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            device_id=device)
    try:
        size = dict(LLAMA_1B, num_hidden_layers=LAYERS)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, size["vocab_size"], (1, SEQ), generator=g).to(device)
        labels = ids.clone()
        labels[0, :1000] = -100           # a masked prompt: the ranks hold different numbers of targets

        model = _build(size, torch.bfloat16, device.type, patch=True).train()
        loss = model(ids, labels=labels).loss
        loss.backward()
        ref_loss = loss.item()
        ref_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        del model, loss
        result = {"env": {k: os.environ.get(k) for k in NVLS_OFF_ENV}, "ref_loss": ref_loss}
        for case in CASES:
            model = _build(size, torch.bfloat16, device.type, patch=True).train()
            if case == "fsdp2-checkpointing":
                model.gradient_checkpointing_enable()
            context_parallel(model)
            model = DDP(model, device_ids=[rank]) if case == "ddp" else fully_shard_transformer(model)
            module = model.module if case == "ddp" else model
            batch = context_parallel_shard(ids, labels, model=module)
            out = model(**batch)
            (out.loss * WORLD).backward()
            total = out.loss.detach().float()
            dist.all_reduce(total)
            grads = {n: _full(p.grad) for n, p in module.named_parameters()}
            result[case] = dict(
                loss=total.item(), loss_err=abs(total.item() - ref_loss) / abs(ref_loss),
                grad_err=max(rel_err(grads[n], ref_grads[n]) for n in ref_grads),
                same_names=sorted(grads) == sorted(ref_grads), logits_none=out.logits is None,
                local_len=batch["input_ids"].shape[1])
            del model, module, out, grads
            torch.cuda.empty_cache()
        write_rank_json(out_dir, rank, result)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn_and_read_json(_worker, tmp_path_factory.mktemp("cp_gpu"), WORLD)


@pytest.mark.parametrize("case", CASES)
def test_context_parallel_matches_one_gpu(results, case):
    for rank, r in enumerate(results):
        assert r["env"] == NVLS_OFF_ENV
        c = r[case]
        assert c["same_names"] and c["logits_none"] and c["local_len"] == SEQ // WORLD
        assert c["loss_err"] < LOSS_TOL, (rank, c, r["ref_loss"])
        assert c["grad_err"] < GRAD_TOL, (rank, c)
