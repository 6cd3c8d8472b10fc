"""The training callback that scores the task suite every `eval.every` steps / `eval.every_tokens` tokens and at
the end.

Every rank runs it (under FSDP each scores a share of the rows); rank 0 writes evals.jsonl and eval_items/, and the
scalars `eval/<task>_<format>/<metric>` go to TensorBoard through the trainer's channel. The final results go to
summary.json's "evals".

It lives outside ablate/eval/ because it is the one place that joins the eval engine and the training callbacks: the
eval package never imports the trainer.
"""
from __future__ import annotations

import time

from ablate import rundir
from ablate.callbacks import Callback, due
from ablate.eval import engine, suite


class EvalSuite(Callback):
    name, order = "eval_suite", 30

    def __init__(self):
        self.tasks = self.tokenizer = None
        self.prepared: dict = {}  # the tasks' token ids, made at the first evaluation and kept
        self.final: dict = {}  # the results at the last step, for summary.json

    def pre_train(self, trainer) -> None:
        from tokenizers import Tokenizer

        self.tasks = suite.parse_tasks(trainer.run.eval.tasks, "eval.tasks")
        self.tokenizer = Tokenizer.from_file(str(trainer.data.tokenizer_path))
        path = trainer.run_dir / rundir.EVALS
        if trainer.dist.is_main and path.exists():  # on resume or rollback, forget evals past the step we continue at
            rundir.rewrite_jsonl(path, [r for r in rundir.read_jsonl(path) if r["step"] <= trainer.step])

    def _due(self, trainer) -> bool:
        cfg = trainer.run.eval
        if due(trainer.step, cfg.every, trainer.max_steps):  # the step cadence all periodic callbacks share
            return True
        return bool(cfg.every_tokens) and (trainer.tokens // cfg.every_tokens) > \
            (trainer.tokens - trainer.last_step_tokens) // cfg.every_tokens

    def post_step(self, trainer) -> None:
        if self._due(trainer):
            self.evaluate(trainer)

    def post_train(self, trainer) -> None:
        if not self.final:  # a run resumed from its last checkpoint took no step
            self.evaluate(trainer)

    def evaluate(self, trainer) -> None:
        cfg, start = trainer.run.eval, time.perf_counter()
        lm = engine.for_transformer(trainer.model, max_len=trainer.seq_len, device=trainer.dist.device,
                                    autocast=trainer.autocast)
        trainer.model.eval()
        try:
            results = suite.evaluate(lm, self.tokenizer, self.tasks, cfg.format, cfg.limit or None, cfg.batch_size,
                                     cache=self.prepared)
        finally:
            trainer.model.train()
        if trainer.step == trainer.max_steps:
            self.final = suite.summary_entry(results)
        if trainer.dist.is_main:
            suite.write_results(trainer.run_dir, trainer.step, trainer.tokens, results)
        trainer.log({f"eval/{r.task}_{r.format}/{name}": value for r in results for name, value in r.metrics.items()},
                    tensorboard_only=True)
        trainer.say(f"step {trainer.step} eval " + "  ".join(f"{r.task} {r.metrics[r.primary]:.3f}" for r in results)
                    + f" ({time.perf_counter() - start:.1f}s)")

    def summary(self) -> dict:
        return {"evals": self.final} if self.final else {}
