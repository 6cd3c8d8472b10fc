"""A cloze task from a local file (`ablate.register_task`): rows of JSONL or JSON, or any format `datasets` reads
locally (csv, parquet, arrow), each with a prompt, a list of choices and the right one (its index or its text),
scored like every shipped task (every metric, bits per byte included, the same signal criteria). The file is read
and every row checked when the task is registered, before any compute: a missing field or an answer out of range
stops the experiment file with the file, row and field.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path

from ablate.components import registry
from ablate.config import ConfigError
from ablate.eval.tasks import Item, Task

DEFAULT_TEMPLATE = "Question: {context}\nAnswer:"  # the OLMES cloze prompt the shipped tasks share
DATASETS_FORMATS = {".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


@dataclass(frozen=True)
class FileTask(Task):
    """A Task whose rows are a local file's (`data` is its absolute path), already checked."""

    checked_rows: tuple = ()

    def rows(self) -> list[dict]:
        return list(self.checked_rows)


def read_rows(path: Path) -> list[dict]:
    """The rows of a local file: JSONL (one object a line), a JSON list, or a format `datasets` reads."""
    if not path.is_file():
        raise ConfigError(f"register_task: {path}: no such file; allowed: a local .jsonl, .json, .csv, .parquet file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8")
        if suffix == ".json" and text.lstrip().startswith("["):
            return json.loads(text)
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        return rows
    if suffix in DATASETS_FORMATS:
        import datasets

        return datasets.load_dataset(DATASETS_FORMATS[suffix], data_files=str(path), split="train").to_list()
    raise ConfigError(
        f"register_task: {path}: format {suffix!r} unknown; allowed: .jsonl, .json, {', '.join(DATASETS_FORMATS)}"
    )


def _gold(row: dict, answer: str, choices: list[str], where: str) -> int:
    value = row[answer]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{where}: field {answer!r} is {value!r}; allowed: an index or one choice's text")
    if isinstance(value, int):
        if not 0 <= value < len(choices):
            raise ConfigError(
                f"{where}: field {answer!r}: index {value} is out of range for {len(choices)} choices; "
                f"allowed: 0..{len(choices) - 1}, or one choice's text"
            )
        return value
    if value not in choices:
        raise ConfigError(f"{where}: field {answer!r}: {value!r} is none of the choices {choices}")
    return choices.index(value)


def check_rows(rows: list[dict], path: Path, context: str, choices: str, answer: str) -> list[dict]:
    """Every row has the three fields, choices a list of >= 2 strings, the answer one of them: rows as
    {"context", "choices", "gold"}."""
    if not rows:
        raise ConfigError(f"{path}: holds no rows")
    checked = []
    for number, row in enumerate(rows, 1):
        where = f"{path}:{number}"
        missing = [f for f in (context, choices, answer) if not isinstance(row, dict) or f not in row]
        if missing:
            present = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ConfigError(f"{where}: missing field {missing[0]!r}; the row has {present}")
        options = row[choices]
        if not isinstance(options, list) or len(options) < 2 or not all(isinstance(c, str) for c in options):
            raise ConfigError(f"{where}: field {choices!r} is {options!r}; allowed: a list of two or more strings")
        if not isinstance(row[context], str):
            raise ConfigError(f"{where}: field {context!r} is {row[context]!r}; allowed: a string")
        checked.append({"context": row[context], "choices": options, "gold": _gold(row, answer, options, where)})
    return checked


def _calling_file() -> Path:
    """The first file up the stack outside ablate's package: the experiment file that registers the task."""
    package = Path(registry.__file__).resolve().parents[1]
    for frame in inspect.stack()[1:]:
        file = Path(frame.filename).resolve()
        if not file.is_relative_to(package):
            return file
    return package


def register_task(
    name: str,
    path: str | Path,
    *,
    context: str,
    choices: str,
    answer: str,
    primary: str = "acc_per_char",
    template: str = DEFAULT_TEMPLATE,
    description: str = "",
) -> Task:
    """Make the cloze task in `path` available as `name` in eval.tasks and `ablate eval --tasks`. `context`,
    `choices` and `answer` name the fields holding the prompt, the list of choices and the right one (its index
    or its text); `template` renders the prompt ("{context}" is replaced), each choice follows after a space.
    A relative path is read from the calling file's folder."""
    caller = _calling_file()
    file = Path(path).expanduser()
    file = file if file.is_absolute() else caller.parent / file
    if "{context}" not in template:
        raise ConfigError(f"register_task({name!r}): template {template!r} has no '{{context}}'")
    rows = check_rows(read_rows(file), file, context, choices, answer)

    def build(row: dict, index: int) -> Item:
        prompt = template.replace("{context}", row["context"].strip())
        texts = [c.strip() for c in row["choices"]]
        return Item(index, [prompt], [f" {c}" for c in texts], row["gold"], prompt, texts)

    task = FileTask(
        name=name,
        data=str(file),
        build=build,
        primary=primary,
        description=description or f"{name}: {len(rows)} items from {file}",
        checked_rows=tuple(rows),
    )
    spec = json.dumps([context, choices, answer, primary, template])
    registry.register("task", name, task, file=str(caller), digest=registry.digest_of(file.read_bytes(), spec))
    return task
