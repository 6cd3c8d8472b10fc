"""What the report reads: run folders -> runs and tasks, like compared with like, and what the runs record of
their tokenizers.

runs.py        run folders -> runs, tasks, scale groups; a metric's direction
match.py       like with like: finals at equal tokens, scores over identical item sets
tokenizers.py  each run's tokenizer and its figures; whether the runs' validation compares (one definition, the same
               text for bits per byte)
flops.py       a run's FLOPs per token from its config.json, without torch (runs from before summary.json had it)
failures.py    each variant's failed and diverged seeds (the decisions' and the adaptive study's)
study.py       an adaptive study's study.json (its rule checked by sections/sequential/)
compute_points.py  one arm at several budgets: the main runs apart from the compute points of the multipliers
logged.py      a metrics.jsonl key as a decision metric (--metric KEY[:lower|higher], --primary KEY): declared, checked
curves.py      a variant's curve over its runs, and every logged key's (report.json groups[].logged)
changes.py     what each variant changes: its config fields that differ from the base variant's
"""
