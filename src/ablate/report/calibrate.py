"""The report calibrated on constructed studies with known answers: how often an A/A study (every variant drawn from
one distribution) claims any difference, and how often a planted effect is found, at the designs users run.

A study is variants x seeds, at one scale or two (a scale axis: decision accuracy from the smaller scale then ranks
each task's metrics), scored at 4 checkpoints on validation loss, a 4-way cloze task with every choice metric, a
continuation task, and a task averaged over subjects with a subject SNR floor. Per-item log-likelihoods are drawn
from the item's difficulty, the run's quality and the run's own item quirks, which persist across its checkpoints as
a real model's do (this is what lets noise pass the consistency gates), plus a small fresh noise per evaluation.
Each variant has item quirks of its own too, the same on every seed and checkpoint (`variant_quirk`, in units of the
run quirks' sd): a population null, where each variant answers some items better and others worse, zero mean over
the population of items, so a pair's difference has a persistent item part that no number of seeds averages away.
Accuracies are 0/1 per item, so run scores move in steps of 1/items and equal per-seed differences happen by chance.

A run's quality = seed effect (shared by every variant's run with that seed: data order and init) + the run's own
effect + a wobble per checkpoint [+ the planted effect on variant "A", at every scale]. The planted effect is in
units of SD_DIFF, the sd of one seed-level paired difference of validation loss.

Every study goes through analyze_runs, the report's whole path after loading (matching, gates, metric choice,
subject floor, the two families, the headline). scripts/calibrate_report.py prints the figures; the tests run
fewer studies of the same designs.
"""

from __future__ import annotations

import math
import multiprocessing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ablate.report.analyze import analyze_runs
from ablate.report.options import Options
from ablate.report.inputs.runs import Point, Run, TaskInfo

STEPS = (10, 20, 30, 40)
SIG_SEED, SIG_RUN, SIG_CKPT = 0.01, 0.02, 0.005  # run quality: seed, run and checkpoint sds
SIG_VAL_ITEM = 0.3  # one validation sequence's loss around its difficulty, per run (a quirk that persists)
VAL_ITEMS = 200
# sd of one seed-level paired difference of validation loss (loss = ... - 2 x quality): the effect-size unit
SD_DIFF = math.sqrt(2 * ((2 * SIG_RUN) ** 2 + SIG_VAL_ITEM**2 / VAL_ITEMS))
MC_METRICS = (
    "acc_raw",
    "acc_per_char",
    "acc_pmi",
    "acc_choices_only",
    "gold_bpb",
    "correct_prob",
    "margin_loglik",
    "margin",
    "total_prob",
)
SUBJECT_METRICS = ("acc_per_char", "gold_bpb")


@dataclass(frozen=True)
class Design:
    seeds: int = 3
    items: int = 60  # per task
    variants: int = 3
    scales: int = 2  # 1: no scale axis; 2: a smaller scale below the one decisions are made at
    subjects: int = 4  # groups of the subject-averaged task (its items split among them)
    effect: float = 0.0  # planted on variant "A", in SD_DIFF units
    variant_quirk: float = 1.0  # sd of each variant's persistent item quirks, in units of the run quirks' sd

    def label(self) -> str:
        what = "A/A" if self.effect == 0 else f"planted {self.effect:g} sd"
        quirks = f", variant quirks {self.variant_quirk:g}" if self.variant_quirk != 1 else ""
        return (
            f"{what}, {self.variants} variants x {self.seeds} seeds, {self.items} items, {self.scales} scale(s){quirks}"
        )


def _choice_metrics(ll, uncond, chars, gold) -> dict[str, np.ndarray]:
    """Per-item metrics of a 4-way cloze task from its log-likelihoods (items, 4)."""
    rows = np.arange(len(gold))
    per_char, pmi = ll / chars, ll - uncond
    gold_ll, gold_chars = ll[rows, gold], chars[rows, gold]
    wrong = np.ones_like(ll, bool)
    wrong[rows, gold] = False
    char_prob = np.exp(per_char)
    return {
        "acc_raw": ll.argmax(1) == gold,
        "acc_per_char": per_char.argmax(1) == gold,
        "acc_pmi": pmi.argmax(1) == gold,
        "acc_choices_only": uncond.argmax(1) == gold,
        "gold_bpb": -gold_ll / (math.log(2) * gold_chars),
        "correct_prob": char_prob[rows, gold],
        "margin_loglik": gold_ll - (ll * wrong).sum(1) / 3,
        "margin": char_prob[rows, gold] - np.where(wrong, char_prob, -np.inf).max(1),
        "total_prob": char_prob.sum(1),
    }


class _Task:
    """One cloze task's fixed items (answer priors, lengths, gold, difficulty) and how a run scores on it."""

    def __init__(self, rng, items: int):
        self.uncond = rng.normal(-9, 1.5, (items, 4))
        self.chars = rng.integers(5, 40, (items, 4)).astype(float)
        self.gold = rng.integers(0, 4, items)
        self.difficulty = rng.normal(0, 1, items)

    def quirks(self, rng, sd: float = 1.0) -> np.ndarray:
        return rng.normal(0, 0.5 * sd, self.uncond.shape)  # per-item, per-choice preferences (a run's, a variant's)

    def score(self, rng, ability: float, quirks: np.ndarray) -> dict[str, np.ndarray]:
        ll = self.uncond + quirks + rng.normal(0, 0.15, quirks.shape)
        ll[np.arange(len(self.gold)), self.gold] += ability - 0.5 * self.difficulty
        return _choice_metrics(ll, self.uncond, self.chars, self.gold)


def _add(run: Run, key: str, step: int, columns: dict[str, np.ndarray], groups: np.ndarray | None = None) -> None:
    """One evaluation of a run: its per-item rows (as eval_items/ would hold) and each metric's mean and stderr."""
    n = len(next(iter(columns.values())))
    columns = {m: np.asarray(c, float) for m, c in columns.items()}
    names = list(columns)  # rows built from plain lists, not element by element: a third of a study's time before
    rows = {f"q{i}": dict(zip(names, values)) for i, values in enumerate(zip(*(columns[m].tolist() for m in names)))}
    if groups is not None:
        for i, row in enumerate(rows.values()):
            row["group"] = f"s{groups[i]}"
    run._items[(key.replace(":", "_"), step)] = rows
    for m, c in columns.items():
        if groups is not None:  # the macro average over groups, each group's mean logged, as the eval suite does
            means = {f"s{g}": float(c[groups == g].mean()) for g in np.unique(groups)}
            for g, value in means.items():
                run.group_scores.setdefault((key, m), {}).setdefault(g, []).append(Point(step, step * 100, value, None))
            value = float(np.mean(list(means.values())))
        else:
            value = float(c.mean())
        run.scores.setdefault((key, m), []).append(
            Point(step, step * 100, value, float(c.std(ddof=1) / math.sqrt(n)), n)
        )


def _tasks(design: Design) -> dict[str, TaskInfo]:
    """The constructed study's tasks: validation loss, a multiple-choice task, a word task scored by greedy accuracy
    and bits per byte, and a task of subjects."""
    items = design.items
    return {
        "val_loss": TaskInfo("val_loss", "loss", ["loss"], math.log(512), "val_loss", VAL_ITEMS),
        "mc:cf": TaskInfo("mc:cf", "acc_per_char", list(MC_METRICS), 0.25, "mc_cf", items),
        "lambada:cf": TaskInfo("lambada:cf", "acc_greedy", ["acc_greedy", "gold_bpb"], 0.0, "lambada_cf", items),
        "subj:cf": TaskInfo(
            "subj:cf",
            "acc_per_char",
            list(SUBJECT_METRICS),
            0.25,
            "subj_cf",
            items,
            groups=[f"s{g}" for g in range(max(1, design.subjects))],
        ),
    }


def study(rng: np.random.Generator, design: Design) -> tuple[list[Run], dict[str, TaskInfo], Options]:
    """(runs, tasks, options) of one constructed study, held in memory."""
    items = design.items
    mc, subj = _Task(rng, items), _Task(rng, items)
    subject_of = np.arange(items) % max(1, design.subjects)
    word_bytes, word_difficulty = rng.integers(3, 12, items).astype(float), rng.normal(0, 1, items)
    val_difficulty = rng.normal(0, 1, VAL_ITEMS)
    widths = [32, 64][-design.scales :]
    names = [chr(ord("A") + k) for k in range(design.variants)]
    runs = []
    for scale_index, width in enumerate(widths):
        seed_fx = rng.normal(0, SIG_SEED, design.seeds)
        for name in names:
            vq = design.variant_quirk  # the variant's own item quirks: the same on each of its seeds
            v_val, v_mc, v_subj = rng.normal(0, SIG_VAL_ITEM * vq, VAL_ITEMS), mc.quirks(rng, vq), subj.quirks(rng, vq)
            v_word = rng.normal(0, 0.5 * vq, items)
            for seed in range(design.seeds):
                label = f"{name}@d{width}" if design.scales > 1 else name
                # variants differ in a config field (as real ones do), so scales pair them by method
                lr = 1e-3 * (1 + names.index(name))
                config = {"model": {"vocab_size": 512, "d_model": width}, "optim": {"lr": lr}, "name": label}
                run = Run(label, seed, Path("in-memory"), config, {}, "finished", "", STEPS[-1])
                run_fx = rng.normal(0, SIG_RUN)
                val_quirk = v_val + rng.normal(0, SIG_VAL_ITEM, VAL_ITEMS)
                mc_quirk, subj_quirk = v_mc + mc.quirks(rng), v_subj + subj.quirks(rng)
                word_quirk = v_word + rng.normal(0, 0.5, items)
                for k, step in enumerate(STEPS):
                    planted = design.effect * SD_DIFF / 2 if name == "A" else 0.0
                    quality = seed_fx[seed] + run_fx + rng.normal(0, SIG_CKPT) + planted
                    ability = 0.3 * k + 0.5 * scale_index + 10 * quality
                    val = 4.5 - 0.25 * k - 0.3 * scale_index - 2 * quality + val_difficulty + val_quirk
                    _add(run, "val_loss", step, {"loss": val + rng.normal(0, 0.05, VAL_ITEMS)})
                    _add(run, "mc:cf", step, mc.score(rng, ability, mc_quirk))
                    word_ll = -2.2 * word_bytes + 0.4 * ability * np.sqrt(word_bytes) - word_difficulty + word_quirk
                    word_ll = word_ll + rng.normal(0, 0.15, items)
                    _add(
                        run,
                        "lambada:cf",
                        step,
                        {
                            "acc_greedy": rng.random(items) < 1 / (1 + np.exp(3.5 - ability + word_difficulty)),
                            "gold_bpb": -word_ll / (math.log(2) * word_bytes),
                        },
                    )
                    scored = subj.score(rng, ability, subj_quirk)
                    _add(run, "subj:cf", step, {m: scored[m] for m in SUBJECT_METRICS}, subject_of)
                runs.append(run)
    tasks = _tasks(design)
    opts = Options(
        bootstrap=0,
        scale=["model.d_model"] if design.scales > 1 else [],
        subject_snr_floor=1.0 if design.subjects > 1 else None,
    )
    return runs, tasks, opts


@dataclass
class Outcome:
    claims: bool  # any significant pair at the decision scale, in either family
    winner: str | None
    primary_found: bool  # A significantly ahead of every other variant on the primary metric
    decisions: int  # decision metrics the headline rests on


def run_study(rng: np.random.Generator, design: Design) -> Outcome:
    runs, tasks, opts = study(rng, design)
    report = analyze_runs(runs, tasks, opts, "calibration")
    target = report.groups[-1]
    claims = any(p.significant for s in target.series for p in s.pairwise)
    val = next(s for s in target.series if s.task == "val_loss")
    ahead = [p for p in val.pairwise if "A" in (p.a, p.b)]
    found = bool(ahead) and all(p.significant and p.better == "A" for p in ahead)
    return Outcome(claims, report.headline.winner, found, len(report.inference.metrics))


def outcomes(design: Design, studies: int, seed: int = 0) -> list[Outcome]:
    rng = np.random.default_rng(seed)
    return [run_study(rng, design) for _ in range(studies)]


def summarize(design: Design, found: list[Outcome]) -> dict:
    """Rates over the studies of one design, with their binomial standard errors."""
    n = len(found)

    def rate(flags) -> tuple[float, float]:
        p = float(np.mean(flags))
        return p, math.sqrt(max(p * (1 - p), 1e-12) / n)

    return {
        "design": design,
        "studies": n,
        "any_claim": rate([o.claims for o in found]),
        "winner_named": rate([o.winner is not None for o in found]),
        "right_winner": rate([o.winner == "A" for o in found]),
        "wrong_winner": rate([o.winner not in (None, "A") for o in found]),
        "primary_found": rate([o.primary_found for o in found]),
        "decision_metrics": float(np.mean([o.decisions for o in found])),
    }


CHUNK = 50  # studies per task handed to a worker process (each chunk has its own random seed)


def calibrate(design: Design, studies: int, seed: int = 0, jobs: int = 1) -> dict:
    """summarize() over `studies` constructed studies of one design, in chunks over `jobs` worker processes."""
    chunks = [(design, min(CHUNK, studies - i), seed * 1_000_003 + i) for i in range(0, studies, CHUNK)]
    if jobs > 1:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            parts = pool.starmap(outcomes, chunks)
    else:
        parts = [outcomes(*c) for c in chunks]
    return summarize(design, [o for part in parts for o in part])
