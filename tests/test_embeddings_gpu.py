"""timestep_embedding, GPU tier: against the float64 reference within fp32's conditioning and against diffusers'
get_timestep_embedding on the GPU (the same op order: ulps apart at most), the configurations of SD / DiT / SD3,
under CUDA-graph capture and torch.compile."""

import pytest
import torch

from flashfuse.ops.embeddings import timestep_embedding
from test_embeddings import check

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dim, flip, shift, scale", [(256, True, 1, 1), (320, True, 0, 1), (1280, False, 1, 1),
                                                    (257, False, 1, 1000), (3, True, 0, 1)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.float16])
def test_timestep_embedding_gpu(dim, flip, shift, scale, dtype):
    diffusers = pytest.importorskip("diffusers")
    from diffusers.models.embeddings import get_timestep_embedding
    t = (torch.rand(1000, device="cuda") * 1000).to(dtype)
    out, ref, bound = check(t, dim, flip, shift, scale)
    theirs = get_timestep_embedding(t, dim, flip, shift, scale)
    assert ((theirs.double() - ref).abs() <= bound).all()
    assert ((out - theirs).abs().double() <= 2 * bound).all()
    del diffusers


def test_cuda_graph_and_compile_gpu():
    t = torch.randint(0, 1000, (32,), device="cuda")
    want = timestep_embedding(t, 256, True)
    graph, static = torch.cuda.CUDAGraph(), t.clone()
    with torch.cuda.graph(graph):
        out = timestep_embedding(static, 256, True)
    static.copy_(t.flip(0))
    graph.replay()
    assert torch.equal(out, want.flip(0))
    fn = torch.compile(lambda x: timestep_embedding(x, 256, True), fullgraph=True)
    assert torch.equal(fn(t), want)
