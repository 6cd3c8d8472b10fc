"""The training callback that scores the task suite every `eval.every` steps / `eval.every_tokens` tokens and at
the end (settings: the run's eval section, through EvalSuite's constructor).

Every rank runs it (under FSDP each scores a share of the rows); rank 0 writes evals.jsonl and eval_items/, and the
scalars `eval/<task>_<format>/<metric>` go to TensorBoard through the trainer's channel. The final results go to
summary.json's "evals".

It lives outside ablate/eval/ because it is the one place that joins the eval engine and the training callbacks: the
eval package never imports the trainer.
"""

from __future__ import annotations

import time

import torch

from ablate import rundir
from ablate.eval import engine, suite
from ablate.training.callbacks.base import Callback, TrainerView, due


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

    def pre_train(self, trainer: TrainerView) -> None:
        from tokenizers import Tokenizer

        self.tasks = suite.parse_tasks(self.tasks_text, "eval.tasks")
        self.tokenizer = Tokenizer.from_file(str(trainer.data.tokenizer_path))
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

    def post_step(self, trainer: TrainerView) -> None:
        if self.acts_at(trainer):
            self.evaluate(trainer)

    def post_train(self, trainer: TrainerView) -> None:
        if not self.final:  # a run resumed from its last checkpoint took no step
            self.evaluate(trainer)

    def evaluate(self, trainer: TrainerView) -> None:
        start = time.perf_counter()
        lm = engine.for_transformer(trainer.model, max_len=trainer.seq_len, device=trainer.dist.device)
        trainer.model.eval()
        # compiled blocks run eagerly here: every batch of contexts has a shape of its own, and recompiling for
        # each costs far more than the forward passes it would speed up
        try:
            with torch.compiler.set_stance("force_eager"):
                results = suite.evaluate(
                    lm,
                    self.tokenizer,
                    self.tasks,
                    self.format,
                    self.limit or None,
                    self.batch_size,
                    cache=self.prepared,
                    metrics=self.metrics,
                )
        finally:
            trainer.model.train()
        if trainer.step == trainer.max_steps:
            self.final = suite.summary_entry(results)
        if trainer.dist.is_main:
            suite.write_results(trainer.run_dir, trainer.step, trainer.tokens, results)
        trainer.log(
            {f"eval/{r.task}_{r.format}/{name}": value for r in results for name, value in r.metrics.items()},
            tensorboard_only=True,
        )
        trainer.say(
            f"step {trainer.step} eval "
            + "  ".join(f"{r.task} {r.metrics[r.primary]:.3f}" for r in results)
            + f" ({time.perf_counter() - start:.1f}s)"
        )

    def summary(self, trainer: TrainerView) -> dict:
        return {"evals": self.final} if self.final else {}
