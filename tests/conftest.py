"""Two tiers: plain ``pytest`` runs the CPU tier (kernels in Triton's interpreter when there is no GPU);
``pytest -m gpu`` runs the GPU tier (real dtypes and sizes, torch.compile).

TRITON_INTERPRET must be set before triton is imported anywhere, so it is set here, at the top of the
first module pytest loads, from a CUDA check that does not import triton.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_finish(session):
    """Selecting the GPU tier on a machine without CUDA is an error, not a row of skips."""
    if not HAS_CUDA and any("gpu" in item.keywords for item in session.items):
        raise pytest.UsageError("the GPU tier (-m gpu) needs a CUDA device; this machine has none")


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
