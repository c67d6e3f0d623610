"""cuda_graph, CPU tier: argument validation and the call signature (CUDA graphs themselves run in the GPU tier,
tests/test_cuda_graph_gpu.py)."""

import pytest
import torch

from flashfuse.cuda_graph import CUDAGraphed, _signature, cuda_graph
from torch.utils import _pytree as pytree


def key(*args, **kwargs):
    return _signature(*pytree.tree_flatten((args, kwargs)))


def test_signature_separates_shapes_strides_dtypes_and_constants():
    x = torch.zeros(2, 3)
    assert key(x, scale=2) == key(torch.ones(2, 3), scale=2)          # values do not matter
    assert key(x, scale=2) != key(x, scale=3)                         # constants are baked into the graph
    assert key(x) != key(torch.zeros(3, 2))
    assert key(x) != key(torch.zeros(3, 2).t())                       # same shape, other strides
    assert key(x) != key(x.double())
    assert key(x) != key([x])                                         # structure
    assert key(x, t=None) != key(x, t=torch.zeros(()))


def test_unhashable_constant_is_rejected():
    with pytest.raises(TypeError, match="leaf 1 is a bytearray"):
        key(torch.zeros(1), bytearray(b"x"))


def test_cpu_tensors_are_rejected():
    graphed = cuda_graph(lambda x: x + 1)
    with pytest.raises(ValueError, match="tensor argument 0 is on cpu; CUDA graphs need CUDA tensors"):
        graphed(torch.zeros(3))
    with pytest.raises(ValueError, match="no tensor arguments"):
        graphed(3)


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn is a int"):
        cuda_graph(3)
    with pytest.raises(ValueError, match="warmup is 0"):
        cuda_graph(torch.nn.Identity(), warmup=0)


def test_module_attributes_fall_through():
    lin = torch.nn.Linear(4, 5)
    lin.config = {"in": 4}
    graphed = cuda_graph(lin)
    assert isinstance(graphed, CUDAGraphed) and graphed.module is lin
    assert graphed.config == {"in": 4} and graphed.out_features == 5
    assert {n for n, _ in graphed.named_parameters()} == {"module.weight", "module.bias"}
    assert graphed.num_graphs == 0
    with pytest.raises(AttributeError):
        graphed.not_an_attribute
