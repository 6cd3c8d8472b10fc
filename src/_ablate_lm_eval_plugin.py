"""Makes `lm_eval --model ablate ...` work with lm-eval's own command.

lm-eval (0.4.13, the newest release here) finds models only in its own registry and has no entry point for other
packages. ablate's install puts `ablate_lm_eval_plugin.pth` in site-packages; Python runs its one line at start-up,
which imports this module. It imports nothing heavy (not torch, not lm_eval): it waits on the import system for
lm-eval's model table (`lm_eval.models`) and, right after that module has run, adds "ablate" to the registry as a
lazy "module:Class" entry, the way lm-eval lists its own models. Nothing else changes, nothing at all happens in a
process that never imports lm-eval, and a failure here only warns: lm-eval itself must keep working.
"""
from __future__ import annotations

import sys
import threading

WATCHED = "lm_eval.models"
MODEL_NAME, MODEL_TARGET = "ablate", "ablate.lm_eval_model:AblateLM"


def register() -> None:
    try:
        from lm_eval.api.registry import model_registry  # lm-eval >= 0.4.10

        if MODEL_NAME not in model_registry:
            model_registry.register(MODEL_NAME, target=MODEL_TARGET)
    except Exception as error:  # an lm-eval without this registry: `ablate-lm-eval` still registers the model
        import warnings

        warnings.warn(f"ablate could not list its model in lm-eval's registry ({type(error).__name__}: {error}); "
                      f"use `ablate-lm-eval` instead of `lm_eval`", stacklevel=2)


class _RegisteringLoader:
    """lm-eval's own loader for `lm_eval.models`, then `register`; everything else goes to the wrapped loader."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        register()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AfterLmEvalModels:
    """A meta path finder (no importlib.abc base: importing that costs ~7 ms at every start-up) that finds nothing
    itself: for `lm_eval.models` it asks the other finders and wraps the loader of what they found."""

    _searching = threading.local()  # another finder that asks sys.meta_path again must not bring us back here

    def find_spec(self, name, path=None, target=None):
        if name != WATCHED or getattr(self._searching, "active", False):
            return None
        self._searching.active = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._searching.active = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)  # a fresh spec: the finder that made it keeps no copy
        return spec


if not any(type(f).__name__ == "_AfterLmEvalModels" for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterLmEvalModels())
