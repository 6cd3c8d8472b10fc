"""The training hook that scores the task suite every `eval.every` steps / `eval.every_tokens` tokens and at the end.

Every rank runs it (under FSDP each scores a share of the rows); rank 0 writes evals.jsonl, eval_items/ and the
TensorBoard scalars `eval/<task>_<format>/<metric>`. The final results go to summary.json's "evals".

It lives outside ablate/eval/ because it is the one place that joins the eval engine and the training hooks: the
eval package never imports the trainer.
"""
from __future__ import annotations

import math
import time

from ablate import rundir
from ablate.eval import engine, suite
from ablate.hooks import Hook, due


class EvalHook(Hook):
    def __init__(self, trainer, logger, start_step: int):
        from tokenizers import Tokenizer

        cfg = trainer.run.eval
        self.cfg, self.logger = cfg, logger
        self.tasks = suite.parse_tasks(cfg.tasks, "eval.tasks")
        self.tokenizer = Tokenizer.from_file(str(trainer.data.tokenizer_path))
        self.done_final = False
        self.prepared: dict = {}  # the tasks' token ids, made at the first evaluation and kept
        path = trainer.run_dir / rundir.EVALS
        if trainer.dist.is_main and path.exists():  # on resume, forget evals the checkpoint had not reached
            rundir.rewrite_jsonl(path, [r for r in rundir.read_jsonl(path) if r["step"] <= start_step])

    def _due(self, trainer) -> bool:
        if due(trainer.step, self.cfg.every, trainer.max_steps):  # the step cadence all periodic hooks share
            return True
        every_tokens = self.cfg.every_tokens
        return bool(every_tokens) and (trainer.tokens // every_tokens) > \
            (trainer.tokens - trainer.tokens_per_step) // every_tokens

    def after_step(self, trainer) -> None:
        if self._due(trainer):
            self.evaluate(trainer)

    def at_end(self, trainer) -> None:
        if not self.done_final:  # a run resumed from its last checkpoint took no step
            self.evaluate(trainer)

    def evaluate(self, trainer) -> None:
        start = time.perf_counter()
        lm = engine.for_transformer(trainer.model, max_len=trainer.seq_len, device=trainer.dist.device,
                                    autocast=trainer.autocast)
        trainer.model.eval()
        try:
            results = suite.evaluate(lm, self.tokenizer, self.tasks, self.cfg.format, self.cfg.limit or None,
                                     self.cfg.batch_size, cache=self.prepared)
        finally:
            trainer.model.train()
        if trainer.step == trainer.max_steps:
            self.done_final = True
            trainer.final_evals = suite.summary_entry(results)
        if trainer.dist.is_main:
            suite.write_results(trainer.run_dir, trainer.step, trainer.tokens, results)
            if self.logger.enabled:
                for r in results:
                    for name, value in r.metrics.items():
                        if math.isfinite(value):
                            self.logger.writer.add_scalar(f"eval/{r.task}_{r.format}/{name}", value, trainer.step)
                self.logger.writer.flush()
            print(f"[{trainer.run.name} seed{trainer.run.train.seed}] step {trainer.step} eval "
                  + "  ".join(f"{r.task} {r.metrics[r.primary]:.3f}" for r in results)
                  + f" ({time.perf_counter() - start:.1f}s)", flush=True)
        trainer.pause_seconds += time.perf_counter() - start
