"""Import ablate from a checkout without installing it, as pyproject.toml's package-dir maps an installed copy:
`ablate` from src/, `ablate.kernels` from kernels/, `ablate_evals` from evals/.

Two ways in. `scripts/gpu_acceptance_measure.py` calls `map_checkout(REPO)`. The GPU bundle copies this file as the
`sitecustomize.py` of its site folder (scripts/gpu_acceptance.py --bundle), so that every Python process started with
that folder on PYTHONPATH (pytest, `python -m ablate`, torchrun's ranks) maps the checkout that $ABLATE_CHECKOUT names.

A rehearsal of an offline GPU machine on a connected one: $ABLATE_BLOCK_IMPORTS (comma-separated top-level names)
makes those imports fail in every such process, as they fail where the packages are not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

MAPPED = {"ablate.kernels": "kernels", "ablate_evals": "evals"}  # package -> folder of the checkout


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    def __init__(self, repo: str):
        self.repo = repo

    def find_spec(self, name, path=None, target=None):
        folder = MAPPED.get(name)
        if folder is None:
            return None
        root = os.path.join(self.repo, folder)
        return importlib.util.spec_from_file_location(
            name, os.path.join(root, "__init__.py"), submodule_search_locations=[root]
        )


class _PathFinderWithout(importlib.abc.MetaPathFinder):
    """sys.meta_path's PathFinder, blind to some top-level names: to find_spec and import they are not installed."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()


def map_checkout(repo: str) -> None:
    """Put `repo`'s src/ first on sys.path and map its kernels/ and evals/ (once per process)."""
    src = os.path.join(repo, "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    if not any(isinstance(f, _CheckoutFolders) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFolders(repo))


def block_imports(names: set[str]) -> None:
    if names:
        finder = _PathFinderWithout(names)
        sys.meta_path[:] = [finder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]


if __name__ == "sitecustomize":  # as the bundle's sitecustomize: act on the environment
    block_imports({n.strip() for n in os.environ.get("ABLATE_BLOCK_IMPORTS", "").split(",") if n.strip()})
    if os.environ.get("ABLATE_CHECKOUT"):
        map_checkout(os.environ["ABLATE_CHECKOUT"])
