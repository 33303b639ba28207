"""Loaded at start-up by every Python process of the peer benchmark's verl run when run.sh puts this
folder on PYTHONPATH (`VERL_ATTN=varlen`): verl's driver, its Ray workers and vLLM's processes.

It registers `peer_varlen` (peer_varlen.py) with transformers right after `transformers.modeling_utils`
is first imported, so processes that never import transformers pay nothing. Any other sitecustomize
on the path (the image's) still runs.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _RegisterAfterModelingUtils:
    """A meta-path finder that wraps the loading of transformers.modeling_utils once."""

    target = "transformers.modeling_utils"

    def find_spec(self, name, path=None, target=None):
        if name != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            if _HERE not in sys.path:
                sys.path.append(_HERE)
            import peer_varlen

            peer_varlen.register()

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _RegisterAfterModelingUtils())

_other = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
)
if _other is not None and _other.loader is not None:
    _module = importlib.util.module_from_spec(_other)
    _other.loader.exec_module(_module)
