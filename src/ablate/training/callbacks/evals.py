"""The training callback that scores the task suite every `eval.every` steps / `eval.every_tokens` tokens and at
the end (settings: the run's eval section, through EvalSuite's constructor).

Every rank runs it (under FSDP each scores a share of the rows); rank 0 writes evals.jsonl and eval_items/, and the
scalars `eval/<task>_<format>/<metric>` go to TensorBoard through the trainer's channel. The final results go to
summary.json's "evals".

It lives outside ablate/eval/ because it is the one place that joins the eval engine and the training callbacks: the
eval package never imports the trainer.

In a stack (`ablate run --stack K`) the members due at one step with the same task set are scored in one stacked
pass (training.stack_eval), which hands each member's EvalSuite its results before its post_step: post_step then
records them (the same files, scalars and summary) instead of scoring again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ablate import rundir
from ablate.eval import engine, suite
from ablate.training.callbacks.base import Callback, TrainerView, due


@dataclass(frozen=True)
class Handed:
    """A member's results of a stacked pass (training.stack_eval), for the step they were scored at."""

    step: int
    results: list[suite.TaskResult]
    seconds: float  # the whole pass's, for all its members
    members: int  # how many members the pass scored


class EvalSuite(Callback):
    name, order = "eval_suite", 30

    def __init__(
        self, tasks: str, format: str, limit: int, batch_size: int, every: int, every_tokens: int, metrics: str = ""
    ):
        """tasks: eval.tasks as written (names and suites, comma-separated); format, limit (0: every item),
        batch_size; every (steps), every_tokens (tokens): when to score, besides the last step; metrics: the
        metrics to compute, comma-separated ("": all; without acc_pmi, acc_choices_only and margin_pmi the
        unconditional pass is skipped). The matmuls run as training's do (bf16 parameters for a bf16 run)."""
        self.tasks_text, self.format, self.limit, self.batch_size = tasks, format, limit, batch_size
        self.metrics = suite.parse_metrics(metrics, "eval.metrics")
        self.every, self.every_tokens = every, every_tokens
        self.tasks = self.tokenizer = None
        self.prepared: dict = {}  # the tasks' token ids, made at the first evaluation and kept
        self.final: dict = {}  # the results at the last step, for summary.json
        self.handed: Handed | None = None  # a stack's results for the coming post_step (hand)

    def pre_train(self, trainer: TrainerView) -> None:
        from tokenizers import Tokenizer

        self.tasks = suite.parse_tasks(self.tasks_text, "eval.tasks")
        self.tokenizer = Tokenizer.from_file(str(trainer.data.tokenizer_path))
        self.handed = None  # nothing a stack scored before a rollback or resume
        path = trainer.run_dir / rundir.EVALS
        if trainer.dist.is_main and path.exists():  # on resume or rollback, forget evals past the step we continue at
            rundir.rewrite_jsonl(path, [r for r in rundir.read_jsonl(path) if r["step"] <= trainer.step])

    def acts_at(self, trainer: TrainerView) -> bool:
        if due(trainer.step, self.every, trainer.max_steps):  # the step cadence all periodic callbacks share
            return True
        return (
            bool(self.every_tokens)
            and (trainer.tokens // self.every_tokens) > (trainer.tokens - trainer.last_step_tokens) // self.every_tokens
        )

    def scoring_key(self, trainer: TrainerView) -> tuple:
        """What this callback's scores depend on besides the model (a stack's members sharing a key are scored in
        one pass; their sequence length and device the stack shares): the tasks, format, limit, batch size (the
        rows' batches), metrics (the requests scored) and the tokenizer's file."""
        return (
            tuple(self.tasks),
            self.format,
            self.limit,
            self.batch_size,
            self.metrics,
            str(trainer.data.tokenizer_path),
        )

    def hand(self, handed: Handed) -> None:
        """A stacked pass's results for this member at handed.step: the next post_step records them if it acts at
        that step, and drops them either way."""
        self.handed = handed

    def post_step(self, trainer: TrainerView) -> None:
        handed, self.handed = self.handed, None
        if not self.acts_at(trainer):
            return
        if handed is not None and handed.step == trainer.step:
            self.record(trainer, handed.results, handed.seconds, handed.members)
        else:
            self.evaluate(trainer)

    def post_train(self, trainer: TrainerView) -> None:
        if not self.final:  # a run resumed from its last checkpoint took no step
            self.evaluate(trainer)

    def evaluate(self, trainer: TrainerView) -> None:
        """Score the model alone and record the results."""
        start = time.perf_counter()
        lm = engine.for_transformer(trainer.model, max_len=trainer.seq_len, device=trainer.dist.device)
        trainer.model.eval()
        # compiled blocks run eagerly here: every batch of contexts has a shape of its own, and recompiling for
        # each costs far more than the forward passes it would speed up
        try:
            with torch.compiler.set_stance("force_eager"):
                results = self.score(lm, suite.evaluate)
        finally:
            trainer.model.train()
        self.record(trainer, results, time.perf_counter() - start)

    def score(self, lm: engine.LogitsModel, evaluate=suite.evaluate):
        """This callback's task suite scored on `lm` by `evaluate` (suite.evaluate, or for a stack's model
        suite.evaluate_members: a list of results per member)."""
        return evaluate(
            lm,
            self.tokenizer,
            self.tasks,
            self.format,
            self.limit or None,
            self.batch_size,
            cache=self.prepared,
            metrics=self.metrics,
        )

    def record(self, trainer: TrainerView, results: list[suite.TaskResult], seconds: float, members: int = 1) -> None:
        """This step's results written (evals.jsonl, eval_items/), logged (TensorBoard) and said; at the last
        step kept for summary.json. `members`: how many members one stacked pass scored (`seconds` its time)."""
        if trainer.step == trainer.max_steps:
            self.final = suite.summary_entry(results)
        if trainer.dist.is_main:
            suite.write_results(trainer.run_dir, trainer.step, trainer.tokens, results)
        trainer.log(
            {f"eval/{r.task}_{r.format}/{name}": value for r in results for name, value in r.metrics.items()},
            tensorboard_only=True,
        )
        together = f", one pass for {members} stacked members" if members > 1 else ""
        trainer.say(
            f"step {trainer.step} eval "
            + "  ".join(f"{r.task} {r.metrics[r.primary]:.3f}" for r in results)
            + f" ({seconds:.1f}s{together})"
        )

    def summary(self, trainer: TrainerView) -> dict:
        return {"evals": self.final} if self.final else {}
