"""lm-eval task configs for the ablate suite: `--include_path` this folder (`ablate_evals.lm_eval_tasks.PATH`).

Each task, `ablate_<name>` (cloze) or `ablate_<name>_mcf`, reads the same items in the same fixed order as
`ablate eval`, so `--limit N` scores the same N items with either tool. The `ablate_*.yaml` files are written from
the task list by `python -m ablate_evals.lm_eval_tasks.generate` (generate.py); `_template_yaml` by hand.
"""

from pathlib import Path

PATH = Path(__file__).resolve().parent
