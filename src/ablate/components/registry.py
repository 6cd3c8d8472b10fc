"""One registry for everything a config field names: optimizers (`optim.name`), feed-forward layers (`model.ffn`),
norms (`model.norm`), attention score modifications (`model.score_mod`) and eval tasks (`eval.tasks`, `--tasks`).

The shipped choices register here exactly as a user's experiment file does (`ablate.register_optimizer`,
`ablate.register_component`, `ablate.register_task`), so every consumer looks a name up in one place and a
component from the user's file runs wherever a shipped one does. Each entry remembers the file that registered it
and a digest of its source: a run's identity covers the user code it trains with (RunConfig.user_code).

Registering the same thing again from the same file (an experiment file executed twice in one process, a study
re-reading an edited file) replaces the entry; another object under a taken name is refused, naming both files.
Imports nothing of ablate but config, so any room may ask it; the shipped entries are there once their owners are
imported (ablate.optim, ablate.model with ablate.components.score_mods, the suite ablate_evals), which the consumers do.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from dataclasses import dataclass
from pathlib import Path

from ablate.config import ConfigError

KINDS = ("optimizer", "ffn", "norm", "score_mod", "task")
# what names each kind in a config, for error messages
FIELD_OF = {
    "optimizer": "optim.name",
    "ffn": "model.ffn",
    "norm": "model.norm",
    "score_mod": "model.score_mod",
    "task": "eval.tasks",
}


class RegistryError(ConfigError):
    """A name registered twice by different code, or a component that does not declare what its kind needs."""


@dataclass(frozen=True)
class Entry:
    """One registered component: what it is, where it was defined, and a digest of its source."""

    kind: str
    name: str
    obj: object
    file: str  # the file whose code defines it (the experiment file, for a user's)
    qualname: str
    digest: str  # sha256 of its source (12 hex): what a run's identity takes of user code
    builtin: bool  # shipped with ablate (the package or its task suite); never part of a run's identity

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


_ENTRIES: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise RegistryError(f"register_component: kind {kind!r} unknown; allowed: {', '.join(KINDS)}")


def source_of(obj: object) -> tuple[str, str, str]:
    """(file, qualified name, source text) of a class or function; for another object, its class's. A class whose
    module is gone from sys.modules (an experiment file run with runpy, read after) is read through its methods."""
    target = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    try:
        file, text = inspect.getsourcefile(target), inspect.getsource(target)
    except (OSError, TypeError):
        functions = [f for f in vars(target).values() if inspect.isfunction(f)] if inspect.isclass(target) else []
        file = functions[0].__code__.co_filename if functions else None
        try:
            text = "".join(inspect.getsource(f) for f in functions) or repr(target)
        except (OSError, TypeError):  # defined where no source is kept (an interactive session)
            text = repr(target)
    return (str(Path(file).resolve()) if file else "<unknown>"), target.__qualname__, text


def digest_of(*texts: str | bytes) -> str:
    h = hashlib.sha256()
    for text in texts:
        h.update(text if isinstance(text, bytes) else text.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


@functools.cache
def _shipped_roots() -> tuple[Path, ...]:
    """The folders of ablate's own code: the package and its task suite (ablate_evals, wherever it is mapped)."""
    import importlib.util

    roots = [Path(__file__).resolve().parents[1]]
    spec = importlib.util.find_spec("ablate_evals")
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p).resolve() for p in spec.submodule_search_locations]
    return tuple(roots)


def _is_builtin(file: str) -> bool:
    return any(Path(file).is_relative_to(root) for root in _shipped_roots())


def register(kind: str, name: str, obj: object, *, file: str | None = None, digest: str | None = None) -> Entry:
    """Add `obj` as `kind` `name`. `file` and `digest` default to where obj's source is and a hash of it (a task read
    from a data file passes its own). The same qualified name from the same file replaces the entry; anything else
    under a taken name raises RegistryError naming both files."""
    _check_kind(kind)
    if not isinstance(name, str) or not name or "," in name or name != name.strip():
        raise RegistryError(f"register {kind}: name {name!r}; allowed: a non-empty string without commas or spaces")
    found_file, qualname, text = source_of(obj)
    entry = Entry(
        kind=kind,
        name=name,
        obj=obj,
        file=file or found_file,
        qualname=qualname,
        digest=digest or digest_of(text),
        builtin=_is_builtin(file or found_file),
    )
    taken = _ENTRIES[kind].get(name)
    if taken is not None and (taken.file, taken.qualname) != (entry.file, entry.qualname):
        raise RegistryError(
            f"{FIELD_OF[kind]} {name!r} is registered twice: {taken.qualname} in {taken.file}, and {qualname} in "
            f"{entry.file}; allowed: one class per name (rename one)"
        )
    _ENTRIES[kind][name] = entry
    return entry


def unregister(kind: str, name: str) -> None:
    """Remove an entry (tests that register throwaway components)."""
    _ENTRIES[kind].pop(name, None)


def entries(kind: str) -> dict[str, Entry]:
    """Every entry of `kind` by name, registration order (the shipped ones first)."""
    _check_kind(kind)
    return dict(_ENTRIES[kind])


def names(kind: str) -> list[str]:
    return list(entries(kind))


def lookup(kind: str, name: str, where: str | None = None) -> Entry:
    """The entry of `kind` named `name`, or ConfigError naming the field and the registered names."""
    found = entries(kind).get(name)
    if found is None:
        raise ConfigError(
            f"{where or FIELD_OF[kind]}: {name!r} unknown; allowed: {', '.join(names(kind))} (or register your own "
            f"in the experiment file: {_HOW[kind]})"
        )
    return found


_HOW = {
    "optimizer": "@ablate.register_optimizer(name)",
    "ffn": '@ablate.register_component("ffn", name)',
    "norm": '@ablate.register_component("norm", name)',
    "score_mod": '@ablate.register_component("score_mod", name)',
    "task": "ablate.register_task(name, path, context=..., choices=..., answer=...)",
}


def user_entries(kind: str, names_used: list[str]) -> list[Entry]:
    """The user's (not shipped) entries among `names_used`, for a run's identity and its folder's record."""
    known = entries(kind)
    return [known[n] for n in names_used if n in known and not known[n].builtin]


def options_for(cfg, cls):
    """`cls.Options` (a dataclass of the component's typed options) filled from model.options: the component's
    own reading of its options, e.g. `self.options = ablate.options_for(config, type(self))`."""
    import dataclasses

    declared = getattr(cls, "Options", None)
    if declared is None:
        return None
    names = {f.name for f in dataclasses.fields(declared)}
    return declared(**{k: v for k, v in cfg.options.items() if k in names})
