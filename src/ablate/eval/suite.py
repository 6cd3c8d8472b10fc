"""Run the task suite on a model: requests -> engine -> metrics, and the files a run folder keeps.

evals.jsonl gets one line per task per evaluation; eval_items/step_<N>/<task>_<format>.jsonl one line per item
(the report's paired tests read those); `--log-samples` one line per request and per item, as lm-eval's does.
A task with groups (MMLU's subjects) reports the mean over groups of each group's mean, and keeps those in "groups".
A continuation task (LAMBADA: one gold continuation, no choices) has one request per item, no unconditional pass,
and its own metrics (metrics.METRICS_BY_KIND); its "chance" is that of its greedy accuracy, 0.
`metrics` picks the metrics to compute (default: all; a task's primary always): a choice task runs the
unconditional pass ("Answer:" + each choice) only when one of them needs it (metrics.UNCONDITIONAL_METRICS), and
the metrics not computed are absent from evals.jsonl, eval_items/ and the samples.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ablate import rundir
from ablate.components import registry
from ablate.config import ConfigError
from ablate.eval import engine
from ablate.eval.metrics import (
    ALL_METRICS,
    METRICS,
    METRICS_BY_KIND,
    ItemScores,
    aggregate,
    item_metrics,
    needs_unconditional,
    predictions,
)
from ablate.eval.tasks import FORMATS, Task, requests_for


def all_tasks() -> dict[str, Task]:
    """Every task by name, from the one registry: the shipped suite's (ablate_evals registers them) and those an
    experiment file registered (ablate.register_task)."""
    import ablate_evals  # noqa: F401

    return {name: entry.obj for name, entry in registry.entries("task").items()}


def user_task_code(tasks: str | Sequence[str]) -> dict[str, str]:
    """{task: digest of its definition and data} for the user tasks among `tasks` (a run's eval.task_code)."""
    return {e.name: e.digest for e in registry.user_entries("task", parse_tasks(tasks, "eval.tasks"))}


def all_suites() -> dict[str, list[str]]:
    from ablate_evals import SUITES

    return SUITES


def _names(given: str | Sequence[str]) -> list[str]:
    """'a, b' or ['a', 'b'] -> ['a', 'b']: stripped, blanks dropped."""
    return [name.strip() for name in (given.split(",") if isinstance(given, str) else given) if name.strip()]


def parse_tasks(given: str | Sequence[str], where: str = "--tasks") -> list[str]:
    """The one parser of task names (--tasks, eval.tasks, callers of evaluate): 'arc_easy,hellaswag' or
    'small,boolq', or such names in a list -> task names, suites expanded, each name once in first-seen order;
    refusing unknown names with the allowed tasks and suites. Its result parses to itself."""
    known, suites = all_tasks(), all_suites()
    names = []
    for name in _names(given):
        if name not in known and name not in suites:
            raise ValueError(
                f"{where}: unknown task {name!r}; allowed: {', '.join(known)}; or a suite: {', '.join(suites)}"
            )
        names += suites.get(name, [name])
    return list(dict.fromkeys(names))


def check_config_tasks(tasks: str) -> None:
    """A run's eval.tasks, checked where experiments are loaded and where training starts (before any compute):
    ConfigError naming an unknown task, or the missing task suite."""
    try:
        parse_tasks(tasks, "eval.tasks")
    except ModuleNotFoundError as exc:
        raise ConfigError(f"eval.tasks: the task suite (package ablate_evals) is not installed: {exc}") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse_metrics(given: str | Sequence[str] | None, where: str = "--metrics") -> tuple[str, ...] | None:
    """The one parser of metric names (--metrics, eval.metrics, callers of evaluate): 'acc_raw,acc_per_char', or
    such names in a list -> those names, each once (None for None, no names or "all": every metric), refusing
    unknown names. Its result parses to itself."""
    names = _names(given or ())
    if not names or names == ["all"]:
        return None
    unknown = [m for m in names if m not in ALL_METRICS]
    if unknown:
        raise ValueError(f"{where}: unknown metric {unknown[0]!r}; allowed: all, {', '.join(ALL_METRICS)}")
    return tuple(dict.fromkeys(names))


def metrics_for(task: Task, fmt: str, metrics: tuple[str, ...] | None) -> tuple[str, ...]:
    """The metrics computed for a task: those asked for that its kind has, and its primary, in the kind's order;
    margin_loglik whenever margin is computed, since runs from before DataDecide's margin logged "margin" for what is
    now margin_loglik: a line with both is new, one with "margin" alone is old (report.runs reads it so)."""
    kind = METRICS_BY_KIND[task.kind]
    if metrics is None:
        return kind
    wanted = set(metrics) | {task.primary_for(fmt)}
    if "margin" in wanted:
        wanted.add("margin_loglik")
    return tuple(m for m in kind if m in wanted)


def uses_unconditional(task: Task, fmt: str, metrics: tuple[str, ...] | None) -> bool:
    """Whether the task's metrics need the unconditional pass (a choice task's "Answer:" + each choice)."""
    return task.kind == "choice" and needs_unconditional(metrics_for(task, fmt, metrics))


def check_format(fmt: str, where: str = "--format") -> str:
    if fmt not in FORMATS:
        raise ValueError(f"{where}: {fmt!r}; allowed: {', '.join(FORMATS)}")
    return fmt


@dataclass
class TaskResult:
    task: str
    format: str
    n: int
    chance: float
    primary: str
    metrics: dict[str, float]
    stderr: dict[str, float]
    truncated: int  # items with at least one request whose context was cut to fit the model
    seconds: float
    items: list[dict] = field(default_factory=list)  # per-item rows for eval_items/
    samples: list[dict] = field(default_factory=list)  # per-request and per-item lines for --log-samples
    groups: dict[str, dict[str, float]] = field(default_factory=dict)  # a grouped task's {group: {metric: mean}}

    def record(self, step: int, tokens: int) -> dict:
        """The evals.jsonl line; "groups" only for a task with groups."""
        return {
            "step": step,
            "tokens": tokens,
            "task": self.task,
            "format": self.format,
            "n": self.n,
            "chance": self.chance,
            "primary": self.primary,
            "metrics": self.metrics,
            "stderr": self.stderr,
            "truncated": self.truncated,
            "seconds": self.seconds,
            **({"groups": self.groups} if self.groups else {}),
        }


def macro_average(rows: list[dict], groups: list[str], names: tuple[str, ...] = METRICS) -> tuple[dict, dict, dict]:
    """(means, stderrs, per-group means) of per-item rows in groups: each metric's mean is the mean over groups of
    the group's mean, its standard error sqrt(sum of the groups' squared standard errors) / number of groups."""
    if not rows:  # no item: NaN means, as aggregate gives
        means, stderrs = aggregate(rows, names)
        return means, stderrs, {}
    members: dict[str, list[dict]] = {}
    for row, group in zip(rows, groups):
        members.setdefault(group, []).append(row)
    per_group = [aggregate(members[g], names) for g in sorted(members)]
    # a group of one item has no spread of its own (aggregate gives 0): it takes the spread of all the items, so a
    # small --limit spread over many groups does not report a standard error of 0
    _, overall = aggregate(rows, names)
    for (_, g_stderrs), g in zip(per_group, sorted(members)):
        if len(members[g]) < 2:
            for m in names:
                g_stderrs[m] = overall[m] * math.sqrt(len(rows))
    means = {m: sum(g_means[m] for g_means, _ in per_group) / len(per_group) for m in names}
    stderrs = {m: math.sqrt(sum(g_stderrs[m] ** 2 for _, g_stderrs in per_group)) / len(per_group) for m in names}
    return means, stderrs, {g: g_means for g, (g_means, _) in zip(sorted(members), per_group)}


@dataclass
class Prepared:
    """A task's items, requests and token ids: what does not change between evaluations of one run."""

    items: list
    requests: list
    spans: list[tuple[int, int, int]]  # per item: (first conditional, first unconditional, number of choices);
    # an item's requests are requests[first conditional:next item's first conditional]
    encoded: list[tuple[list[int], list[int]]]
    unconditional: bool = True  # a choice task's unconditional requests are there (else each item's stop at k)


def prepare(tokenizer, task: Task, fmt: str, limit: int | None, unconditional: bool = True) -> Prepared:
    items = task.items(limit)
    requests, spans = [], []
    for item in items:
        conditional, uncond = requests_for(item, fmt, task.kind)
        spans.append((len(requests), len(requests) + len(conditional), len(conditional)))
        requests += conditional + (uncond if unconditional else [])
    return Prepared(items, requests, spans, engine.encode(tokenizer, requests), unconditional)


def prepared(
    cache: dict, tokenizer, task: Task, fmt: str, limit: int | None, metrics: tuple[str, ...] | None = None
) -> Prepared:
    """A task's Prepared from `cache` (made and kept there the first time), with the unconditional requests only
    when the metrics need them; keyed by tokenizer too."""
    unconditional = uses_unconditional(task, fmt, metrics)
    key = (id(tokenizer), task.name, fmt, limit, unconditional)
    if key not in cache:
        cache[key] = prepare(tokenizer, task, fmt, limit, unconditional)
    return cache[key]


def scored_requests(task: Task, fmt: str, prepared: Prepared, metrics: tuple[str, ...] | None) -> list[int]:
    """The indices of the requests to score: each item's conditional ones, and its unconditional ones only when one
    of the metrics needs them."""
    use_unconditional = uses_unconditional(task, fmt, metrics)
    if use_unconditional and not prepared.unconditional:
        raise ValueError(f"{task.name}: its metrics need the unconditional requests, which were not prepared")
    return [j for cond, uncond, k in prepared.spans for j in range(cond, uncond + (k if use_unconditional else 0))]


def evaluate_task(
    lm: engine.LogitsModel,
    tokenizer,
    task: Task,
    fmt: str = "cf",
    limit: int | None = 1000,
    batch_size: int = 32,
    log_samples: bool = False,
    prepared: Prepared | None = None,
    metrics: tuple[str, ...] | None = None,
) -> TaskResult:
    if lm.members is not None:
        raise ValueError(
            f"evaluate_task: a stack of {lm.members} models (LogitsModel.members); evaluate_members scores it"
        )
    return _evaluate_task(lm, tokenizer, task, fmt, limit, batch_size, log_samples, prepared, metrics)[0]


def _evaluate_task(lm, tokenizer, task, fmt, limit, batch_size, log_samples, prepared, metrics) -> list[TaskResult]:
    """Each member's TaskResult (one model: a list of one)."""
    start = time.perf_counter()
    use_unconditional = uses_unconditional(task, fmt, metrics)
    prepared = prepared or prepare(tokenizer, task, fmt, limit, use_unconditional)
    wanted = scored_requests(task, fmt, prepared, metrics)
    encoded = [prepared.encoded[j] for j in wanted]
    per_member = (
        [engine.score(lm, encoded, batch_size)] if lm.members is None else engine.score_members(lm, encoded, batch_size)
    )
    results = [
        _task_result(task, fmt, prepared, dict(zip(wanted, scores)), metrics, log_samples) for scores in per_member
    ]
    share = (time.perf_counter() - start) / len(results)
    return [replace(r, seconds=share) for r in results]


def _task_result(
    task: Task,
    fmt: str,
    prepared: Prepared,
    scored: dict[int, engine.Scored],
    metrics: tuple[str, ...] | None,
    log_samples: bool,
) -> TaskResult:
    """The task's result from its requests' scores (request index -> Scored); `seconds` left 0 for the caller."""
    names = metrics_for(task, fmt, metrics)
    use_unconditional = uses_unconditional(task, fmt, metrics)
    items, requests, spans = prepared.items, prepared.requests, prepared.spans
    uncond_counts = [k if use_unconditional else 0 for _, _, k in spans]
    rows, samples, truncated = [], [], 0
    for item, (cond, uncond, k), k_uncond in zip(items, spans, uncond_counts):
        mine = [requests[cond + i] for i in range(k)]
        s = ItemScores(
            logprobs=[scored[cond + i].logprob for i in range(k)],
            unconditional=[scored[uncond + i].logprob for i in range(k_uncond)],
            tokens=[scored[cond + i].tokens for i in range(k)],
            chars=[len(r.continuation) for r in mine],
            bytes=[len(r.continuation.encode()) for r in mine],
            gold=item.gold,
            greedy=[scored[cond + i].greedy for i in range(k)],
        )
        truncated += any(scored[j].truncated for j in range(cond, uncond + k_uncond))
        rows.append(
            {
                "id": item.id,
                "gold": item.gold,
                **({"group": item.group} if item.group else {}),
                **item_metrics(s, task.kind, names),
            }
        )
        if log_samples:
            for j in range(cond, uncond + k_uncond):
                r, sc = requests[j], scored[j]
                samples.append(
                    {
                        "type": "request",
                        "task": task.name,
                        "format": fmt,
                        "id": item.id,
                        "context": r.context,
                        "continuation": r.continuation,
                        "tokens": sc.tokens,
                        "chars": len(r.continuation),
                        "logprob": sc.logprob,
                        "greedy": sc.greedy,
                        "conditional": j < uncond,
                        "truncated": sc.truncated,
                    }
                )
            samples.append(
                {
                    "type": "item",
                    "task": task.name,
                    "format": fmt,
                    "id": item.id,
                    "choices": [r.continuation for r in mine],
                    "gold": item.gold,
                    **({"predictions": predictions(s)} if task.kind == "choice" else {"greedy": s.greedy[item.gold]}),
                }
            )
    groups = {}
    if task.group is not None:
        means, stderrs, groups = macro_average(rows, [item.group for item in items], names)
    else:
        means, stderrs = aggregate(rows, names)
    # the chance level of the task's accuracies: 1/choices, or 0 for greedy reproduction of a continuation
    chance = (
        0.0 if task.kind == "continuation" else sum(1 / len(item.continuations) for item in items) / max(len(items), 1)
    )
    return TaskResult(
        task=task.name,
        format=fmt,
        n=len(items),
        chance=chance,
        primary=task.primary_for(fmt),
        metrics=means,
        stderr=stderrs,
        truncated=truncated,
        seconds=0.0,
        items=rows,
        samples=samples,
        groups=groups,
    )


def evaluate(
    lm: engine.LogitsModel,
    tokenizer,
    tasks: str | Sequence[str],
    fmt: str = "cf",
    limit: int | None = 1000,
    batch_size: int = 32,
    log_samples: bool = False,
    cache: dict | None = None,
    metrics: str | Sequence[str] | None = None,
) -> list[TaskResult]:
    """Score each of `tasks` on `metrics` (None: all), each as parse_tasks and parse_metrics return them (their
    results pass through unchanged) or as they accept them (text or a list; checked here the same way). `cache` (a
    dict the caller keeps, as the training hook does) saves re-tokenizing the same requests at every evaluation
    (measured: 2.4 s for the 11 tasks at 1000 items)."""
    if lm.members is not None:
        raise ValueError(f"evaluate: a stack of {lm.members} models (LogitsModel.members); evaluate_members scores it")
    return _evaluate(lm, tokenizer, tasks, fmt, limit, batch_size, log_samples, cache, metrics)[0]


def evaluate_members(lm: engine.LogitsModel, *args, **kwargs) -> list[list[TaskResult]]:
    """`evaluate` (the same arguments after `lm`) for a stack's members (LogitsModel.members), every task in one
    pass for all: per member, its results as `evaluate` gives for its model alone, but `seconds`, each member's
    share of the pass."""
    if lm.members is None:
        raise ValueError("evaluate_members: one model (LogitsModel.members is None); evaluate scores it")
    bound = inspect.signature(evaluate).bind(lm, *args, **kwargs)  # evaluate's defaults, in one place
    bound.apply_defaults()
    return _evaluate(*bound.args)


def _evaluate(lm, tokenizer, tasks, fmt, limit, batch_size, log_samples, cache, metrics) -> list[list[TaskResult]]:
    """Each member's results, task by task (one model: a list of one)."""
    known = all_tasks()
    tasks = parse_tasks(tasks)
    check_format(fmt)
    metrics = parse_metrics(metrics)
    cache = {} if cache is None else cache
    by_task = []
    for name in tasks:
        ready = prepared(cache, tokenizer, known[name], fmt, limit, metrics)
        by_task.append(_evaluate_task(lm, tokenizer, known[name], fmt, limit, batch_size, log_samples, ready, metrics))
    return [list(member) for member in zip(*by_task)] if by_task else [[] for _ in range(lm.members or 1)]


def write_results(run_dir: Path, step: int, tokens: int, results: list[TaskResult]) -> list[str]:
    """Append to evals.jsonl and write the per-item files of this evaluation. A step evaluated again keeps every
    evals.jsonl line, but its item files (and, in `ablate report`, its scores) become the latest evaluation's;
    returns the item files replaced so, for the caller to say."""
    with (Path(run_dir) / rundir.EVALS).open("a") as f:
        for r in results:
            f.write(json.dumps(r.record(step, tokens)) + "\n")
    replaced = []
    for r in results:
        path = rundir.items_path(run_dir, step, f"{r.task}_{r.format}")
        if path.is_file():
            replaced.append(f"{path} ({len(path.read_text().splitlines())} items -> {len(r.items)})")
        rundir.write_items(run_dir, step, f"{r.task}_{r.format}", r.items)
    return replaced


def write_samples(path: str | Path, results: list[TaskResult]) -> None:
    with Path(path).open("w") as f:
        for r in results:
            for line in r.samples:
                f.write(json.dumps(line) + "\n")


def summary_entry(results: list[TaskResult]) -> dict:
    """summary.json's "evals": {task: {primary, value, stderr, chance}}."""
    return {
        r.task: {"primary": r.primary, "value": r.metrics[r.primary], "stderr": r.stderr[r.primary], "chance": r.chance}
        for r in results
    }


def format_task_list(limit: int | None = None) -> str:
    """`ablate eval --list`: each task (items, items scored at `limit`, primary metric, its description's first
    line), then each suite (tasks, items, items at `limit`, the tasks it names)."""
    tasks, suites = all_tasks(), all_suites()
    sizes = {name: len(task.rows()) for name, task in tasks.items()}
    scored = {name: min(n, limit) if limit else n for name, n in sizes.items()}
    at = f"at {limit}" if limit else "at all"
    width = max(map(len, tasks))
    lines = [f"{'task':<{width}}{'items':>7}{at:>9}  {'primary':<14}description"]
    for name, task in tasks.items():
        first = task.description.strip().splitlines()[0] if task.description.strip() else ""
        lines.append(f"{name:<{width}}{sizes[name]:>7}{scored[name]:>9}  {task.primary:<14}{first}")
    lines += ["", f"{'suite':<{width}}{'tasks':>7}{'items':>9}{at:>9}  tasks"]
    for name, members in suites.items():
        lines.append(
            f"{name:<{width}}{len(members):>7}{sum(sizes[t] for t in members):>9}"
            f"{sum(scored[t] for t in members):>9}  {', '.join(members)}"
        )
    return "\n".join(lines)


# (header, metric) columns of the table; a metric the task's kind lacks prints "-"
TABLE_COLUMNS = (
    ("raw", "acc_raw"),
    ("tok", "acc_per_token"),
    ("char", "acc_per_char"),
    ("pmi", "acc_pmi"),
    ("c-only", "acc_choices_only"),
    ("greedy", "acc_greedy"),
    ("bpb", "gold_bpb"),
    ("cprob", "correct_prob"),
    ("ncprob", "norm_correct_prob"),
)


def results_table(results: list[TaskResult]) -> str:
    width = max([15] + [len(r.task) + 1 for r in results])
    head = (
        f"{'task':<{width}}{'fmt':<5}{'n':>6}{'chance':>8}  {'primary':<18}{'value':>7}{'+-':>6}"
        + "".join(f"{label:>8}" for label, _ in TABLE_COLUMNS)
        + f"{'trunc':>6}{'sec':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        m = r.metrics
        cells = "".join(f"{m[name]:>8.3f}" if name in m else f"{'-':>8}" for _, name in TABLE_COLUMNS)
        lines.append(
            f"{r.task:<{width}}{r.format:<5}{r.n:>6}{r.chance:>8.3f}  {r.primary:<18}{m[r.primary]:>7.3f}"
            f"{r.stderr[r.primary]:>6.3f}{cells}{r.truncated:>6}{r.seconds:>7.1f}"
        )
    return "\n".join(lines)
