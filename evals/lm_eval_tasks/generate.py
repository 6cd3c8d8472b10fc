"""The `ablate_*.yaml` task configs beside this file, written from the task list (`ablate_evals.TASKS`), so a task
added there gets its configs without writing them by hand:

    python -m ablate_evals.lm_eval_tasks.generate           # write them (and remove those of tasks no longer listed)
    python -m ablate_evals.lm_eval_tasks.generate --check   # exit 1 naming each file that differs (a test runs it)

A choice task gets `ablate_<name>.yaml` (cloze) and `ablate_<name>_mcf.yaml`, each including `_template_yaml`
(written by hand: what every choice task shares); a continuation task (LAMBADA), scored the same in either format,
one `ablate_<name>.yaml` that stands alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ablate.eval.tasks import Task
from ablate_evals.lm_eval_tasks import PATH

CHOICE = """include: _template_yaml
task: ablate_{name}{suffix}
dataset_kwargs:
  task: {name}
  format: {format}
"""

CONTINUATION = (
    "# A continuation task: one request per item, lm-eval's loglikelihood (log-probability, is_greedy), read from\n"
    """# ablate's items as the multiple-choice tasks are (utils.load).
custom_dataset: !function utils.load
dataset_kwargs:
  task: {name}
  format: cf
task: ablate_{name}
output_type: loglikelihood
test_split: test
doc_to_text: !function utils.doc_to_text
doc_to_target: !function utils.continuation
target_delimiter: ""  # ablate's continuation carries its own leading space
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
)


def configs(tasks: dict[str, Task] | None = None) -> dict[str, str]:
    """{file name: text} of every task's configs (default: the task list's), in the list's order."""
    if tasks is None:
        from ablate_evals import TASKS as tasks
    files = {}
    for name, task in tasks.items():
        if task.kind == "continuation":
            files[f"ablate_{name}.yaml"] = CONTINUATION.format(name=name)
            continue
        for fmt, suffix in (("cf", ""), ("mcf", "_mcf")):
            files[f"ablate_{name}{suffix}.yaml"] = CHOICE.format(name=name, suffix=suffix, format=fmt)
    return files


def stale(folder: Path = PATH, tasks: dict[str, Task] | None = None) -> list[str]:
    """The config files in `folder` that differ from what the task list gives: missing, changed, or of no task."""
    wanted = configs(tasks)
    on_disk = {p.name for p in folder.glob("ablate_*.yaml")}
    changed = [n for n, text in wanted.items() if n not in on_disk or (folder / n).read_text() != text]
    return changed + sorted(on_disk - set(wanted))


def write(folder: Path = PATH, tasks: dict[str, Task] | None = None) -> list[str]:
    """Make `folder`'s config files what the task list gives; returns the names written or removed."""
    wanted = configs(tasks)
    names = stale(folder, tasks)
    for name in names:
        if name in wanted:
            (folder / name).write_text(wanted[name])
        else:
            (folder / name).unlink()
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a config differs")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"{PATH / name}: differs from the task list; run python -m ablate_evals.lm_eval_tasks.generate")
        return 1 if names else 0
    for name in write():
        print(f"wrote {PATH / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
