"""The public API: every exported name resolves, and importing flashfuse pulls in neither transformers nor
diffusers (they are optional extras)."""

import subprocess
import sys

import flashfuse
import flashfuse.integrations
import flashfuse.nn


def test_every_exported_name_resolves():
    for module in (flashfuse, flashfuse.nn, flashfuse.integrations):
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert not missing, f"{module.__name__}.__all__ names missing attributes: {missing}"


def test_import_does_not_import_optional_libraries():
    code = "import sys, flashfuse; print('transformers' in sys.modules, 'diffusers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
