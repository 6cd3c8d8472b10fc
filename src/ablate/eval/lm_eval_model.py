"""lm-eval's `ablate` model: a run folder or checkpoint scored by ablate's engine inside lm-eval.

    ablate-lm-eval --model ablate --model_args path=runs/x/base/seed0[,dtype=bf16] --tasks ablate_arc_easy

`dtype` (fp32 or bf16) defaults to the run's train.dtype, as `ablate eval` does.

lm-eval 0.4 finds other packages' models only in its registry and has no entry point for them yet: importing this
module registers the class, which `ablate-lm-eval` (ablate.cli.lm_eval) does before lm-eval's CLI, and Python code
does before `lm_eval.simple_evaluate(model="ablate", ...)`. Nothing is installed into users' start-up.
"""

from __future__ import annotations

import lm_eval.models  # noqa: F401  lm-eval fills its model registry only when it is empty: fill it first
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from ablate.eval import engine
from ablate.eval.tasks import Request


@register_model("ablate")
class AblateLM(LM):
    def __init__(self, path: str, batch_size: int | str = 32, device: str = "cpu", dtype: str | None = None, **_):
        super().__init__()
        if dtype not in (None, "", "fp32", "bf16"):
            raise ValueError(f"--model_args dtype={dtype}; allowed: fp32, bf16")
        from ablate.eval.load import load_model

        if not device or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cpu"  # lm-eval's CLI asks for cuda by default
        self.loaded = load_model(path, device=device)
        self.tokenizer = self.loaded.tokenizer()
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 32  # "auto" -> the engine's default
        self.lm, self.dtype = engine.for_loaded(self.loaded, device, dtype)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [Request(*r.args) for r in requests]
        with torch.no_grad():
            scored = engine.score(self.lm, engine.encode(self.tokenizer, pairs), self.batch_size)
        return [(s.logprob, s.greedy) for s in scored]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(
            "ablate's lm-eval model scores multiple-choice (loglikelihood) tasks only; "
            "loglikelihood_rolling (perplexity tasks) is not implemented"
        )

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(
            "ablate's lm-eval model scores multiple-choice (loglikelihood) tasks only; "
            "generation is not implemented (pre-training ablations use cloze scoring)"
        )
