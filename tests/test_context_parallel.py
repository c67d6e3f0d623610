"""Context-parallel training of transformers models (flashfuse.distributed.context_parallel) equals training on the
whole sequence in one process (CPU tier: 2 gloo processes, fp32, the kernels in Triton's interpreter).

One spawn of 2 ranks runs every case. Each rank builds the same model (seed 0), makes it context parallel, takes
its zig-zag (or contiguous) shard of a fixed global batch (2 sequences of 16 tokens, some targets masked) with
``context_parallel_shard``, and runs one forward and backward; the gradients are summed over the ranks (by hand,
or by FSDP2's reduce-scatter times the world size). The parent computes the same model's loss and gradients on
the whole batch in one process and compares: the loss (summed over ranks) and every parameter's gradient.

Cases: ``zigzag`` / ``contiguous`` (patched Llama), ``unpatched`` (HF's own modules and loss; only the attention
and the positions change), ``window`` (a patched Mistral with a 5-token sliding window, which crosses the shards'
chunk boundaries), ``fsdp2`` (patched, context parallel, then fully_shard_transformer on the same ranks),
``checkpointing`` (HF's gradient checkpointing: every layer's forward, ring attention included, runs again in
the backward, in the same order on every rank). The ranks also check the refusals (ValueError) and that
remove_context_parallel restores the model.
"""

import os

import pytest
import torch
import torch.distributed as dist

from flashfuse.distributed import (context_parallel, context_parallel_positions, context_parallel_shard,
                                   fully_shard_transformer, remove_context_parallel)
from flashfuse.distributed.context_parallelism import RING_NAME
from testing import rel_err, spawn_nvls_off  # noqa: E402

WORLD = 2
BATCH, SEQ = 2, 16           # zig-zag on 2 ranks: 4 chunks of 4 tokens; each rank holds 8 tokens per row
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = ("zigzag", "contiguous", "unpatched", "window", "fsdp2", "checkpointing")
# fp32: the runs differ in summation order only (the ring merges partial softmaxes by their LSE, the loss sums per
# rank, the gradients add over ranks): ~1e-7 per reduction; 1e-5 leaves 10x+ margin, while a token at the wrong
# position (RoPE), a missing chunk or a wrong shift of the labels moves the loss and gradients by 1e-2 or more.
LOSS_TOL, GRAD_TOL = 1e-5, 1e-5


def build_model(case):
    import transformers

    from flashfuse.integrations import patch_transformers

    torch.manual_seed(0)
    if case == "window":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**CONFIG, sliding_window=5))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.train()
    return model if case == "unpatched" else patch_transformers(model)


def global_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, CONFIG["vocab_size"], (BATCH, SEQ), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100   # a masked prompt: the ranks hold different numbers of targets
    labels[1, 9] = -100
    return ids, labels


def _full(t):
    from torch.distributed.tensor import DTensor
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _count_ring_calls():
    """Count the ring attention calls of the layers from now on (a list whose pop() gives the count)."""
    import flashfuse.distributed.context_parallelism as cp

    original = getattr(cp.ring_flash_attn_func, "__wrapped_ring__", cp.ring_flash_attn_func)
    count = [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    counting.__wrapped_ring__ = original
    cp.ring_flash_attn_func = counting
    return count


def _refusals(model, batch):
    """The ValueErrors a context-parallel model raises (messages), and remove_context_parallel's effect."""
    messages = []
    no_count = {k: v for k, v in batch.items() if k != "num_items_in_batch"}
    for kwargs in (dict(batch, position_ids=torch.arange(SEQ // WORLD)[None]),
                   dict(input_ids=batch["input_ids"], labels=batch["labels"]),
                   dict(batch, attention_mask=torch.ones_like(batch["input_ids"]).index_fill_(1, torch.tensor([0]), 0)),
                   dict(input_ids=batch["input_ids"][:, :-1]),
                   no_count):
        try:
            model(**kwargs)
            messages.append(None)
        except ValueError as e:
            messages.append(str(e))
    for call in (lambda: context_parallel(model),
                 lambda: context_parallel_shard(torch.zeros(1, SEQ, dtype=torch.long), model=model,
                                                layout="contiguous")):
        try:
            call()
            messages.append(None)
        except ValueError as e:
            messages.append(str(e))
    model.set_attn_implementation("sdpa")       # switched behind context_parallel's back
    try:
        model(**batch)
        messages.append(None)
    except ValueError as e:
        messages.append(str(e))
    model.set_attn_implementation(RING_NAME)
    remove_context_parallel(model)
    attributes_left = [type(m).__name__ for m in model.modules() if hasattr(m, "_flashfuse_ring")]
    restored = model.config._attn_implementation
    loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss   # a plain local forward again
    return messages, restored, bool(torch.isfinite(loss)), attributes_left


def _worker(rank, tmp):
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=WORLD)
    try:
        ids, labels = global_batch()
        results = {}
        for case in CASES:
            layout = "contiguous" if case == "contiguous" else "zigzag"
            model = build_model(case)
            if case == "checkpointing":
                model.gradient_checkpointing_enable()
            calls = _count_ring_calls()
            before = model.config._attn_implementation
            context_parallel(model, layout=layout)
            if case == "fsdp2":
                fully_shard_transformer(model)
            batch = context_parallel_shard(ids, labels, model=model)     # the model's layout and group
            out = model(**batch)
            loss = out.loss
            (loss * (WORLD if case == "fsdp2" else 1)).backward()
            grads = {n: _full(p.grad) for n, p in model.named_parameters()}
            if case != "fsdp2":        # FSDP2 reduce-scatters (averages); here the sum is by hand
                for g in grads.values():
                    dist.all_reduce(g)
            total = loss.detach().clone()
            dist.all_reduce(total)
            results[case] = dict(loss=total.item(), grads=grads, logits_none=out.logits is None, before=before,
                                 local_len=batch["input_ids"].shape[1], ring_calls=calls.pop())
            if case == "zigzag":
                results["refusals"] = _refusals(model, batch)
            del model
        torch.save(results, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("context_parallel")
    spawn_nvls_off(_worker, (str(tmp),), WORLD)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(WORLD)]


def _reference(case):
    model = build_model(case)
    ids, labels = global_batch()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", CASES)
def test_context_parallel_equals_one_process(runs, case):
    ref_loss, ref_grads = _reference(case)
    for rank, results in enumerate(runs):
        r = results[case]
        assert r["local_len"] == SEQ // WORLD
        layers = CONFIG["num_hidden_layers"]       # one ring call per layer; checkpointing runs each twice
        assert r["ring_calls"] == (2 * layers if case == "checkpointing" else layers), r["ring_calls"]
        assert r["logits_none"] == (case != "unpatched")     # the patched models ran the fused loss
        assert abs(r["loss"] - ref_loss) <= LOSS_TOL * abs(ref_loss), (rank, r["loss"], ref_loss)
        assert r["grads"].keys() == ref_grads.keys()
        for name, ref in ref_grads.items():
            assert torch.isfinite(r["grads"][name]).all(), (rank, name)
            err = rel_err(r["grads"][name], ref)
            assert err <= GRAD_TOL, (rank, name, err)


def test_context_parallel_refusals_and_removal(runs):
    for results in runs:
        messages, restored, finite, attributes_left = results["refusals"]
        assert "do not pass position_ids" in messages[0]
        assert "labels without shift_labels" in messages[1]
        assert "attention_mask has padding" in messages[2]
        assert "needs an even number" in messages[3]
        assert "without num_items_in_batch" in messages[4]
        assert "already context parallel" in messages[5]
        assert "layout is 'contiguous' but the model is context parallel with layout 'zigzag'" in messages[6]
        assert "attention implementation is now 'sdpa'" in messages[7]
        assert restored == results["zigzag"]["before"] != RING_NAME
        assert finite and not attributes_left


def test_positions():
    # 16 tokens on 2 ranks, zig-zag: rank 0 holds 0-3 and 12-15, rank 1 holds 4-11
    assert context_parallel_positions(8, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert context_parallel_positions(8, 1, 2).tolist() == list(range(4, 12))
    assert context_parallel_positions(8, 1, 2, layout="contiguous").tolist() == list(range(8, 16))
    with pytest.raises(ValueError, match="even number"):
        context_parallel_positions(7, 0, 2)
    with pytest.raises(ValueError, match="layout is 'ring'"):
        context_parallel_positions(8, 0, 2, layout="ring")


def test_needs_a_process_group():
    assert not dist.is_initialized()
    model = build_model("zigzag")
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        context_parallel(model)
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        context_parallel_shard(torch.zeros(1, 8, dtype=torch.long))


def test_unsupported_models_are_refused():
    """What context parallelism would train silently wrong is refused before any process group is needed."""
    import transformers

    llama = build_model("unpatched")
    llama.config.layer_types = ["full_attention", "linear_attention"]          # a hybrid (Qwen3-Next style)
    with pytest.raises(NotImplementedError, match="linear_attention"):
        context_parallel(llama)
    dynamic = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **CONFIG, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}))
    with pytest.raises(NotImplementedError, match="rope_type 'dynamic'"):
        context_parallel(dynamic)
    bart = transformers.BartForCausalLM(transformers.BartConfig(
        vocab_size=64, d_model=16, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=32,
        encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, max_position_embeddings=64))
    with pytest.raises(ValueError, match="takes no position_ids"):
        context_parallel(bart)
    with pytest.raises(ValueError, match="PreTrainedModel"):
        context_parallel(torch.nn.Linear(2, 2))
