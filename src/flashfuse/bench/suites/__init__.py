"""The benchmark suites by name (``flashfuse bench <name>``), in the order ``flashfuse bench`` runs them.

A new suite is one module here with a ``harness.Suite`` subclass, plus one entry in ``SUITES``.
"""

from __future__ import annotations

from ..harness import Suite
from .attention import Attention
from .decode import Decode
from .diffusion import Diffusion
from .distributed import Distributed
from .llm import LLM
from .models import Models
from .vector_add import VectorAdd

SUITES: dict[str, type[Suite]] = {
    cls.name: cls for cls in (VectorAdd, Attention, Decode, LLM, Diffusion, Models, Distributed)}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; available: {', '.join(SUITES)}")
    return SUITES[name]()
