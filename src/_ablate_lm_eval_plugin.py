"""Makes `lm_eval --model ablate ...` work with lm-eval's own command.

lm-eval (0.4.13, the newest release here) finds models only in its own registry and has no entry point for other
packages. ablate's install puts `ablate_lm_eval_plugin.pth` in site-packages; Python runs its one line at start-up,
which imports this module. It imports nothing heavy (not torch, not lm_eval): it waits on the import system for
lm-eval's model table (`lm_eval.models`) and, right after that module has run, adds "ablate" to the registry as a
lazy "module:Class" entry, the way lm-eval lists its own models. Nothing else changes, and nothing at all happens
in a process that never imports lm-eval.
"""
from __future__ import annotations

import sys

WATCHED = "lm_eval.models"
MODEL_NAME, MODEL_TARGET = "ablate", "ablate.lm_eval_model:AblateLM"


def register() -> None:
    from lm_eval.api.registry import model_registry

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)


class _AfterLmEvalModels:
    """A meta path finder (no importlib.abc base: importing that costs ~7 ms at every start-up) that finds nothing
    itself: for `lm_eval.models` it asks the other finders, then runs `register` after the module."""

    def find_spec(self, name, path=None, target=None):
        if name != WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module):
            run_module(module)
            register()

        loader.exec_module = exec_module
        return spec


if not any(isinstance(f, _AfterLmEvalModels) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterLmEvalModels())
