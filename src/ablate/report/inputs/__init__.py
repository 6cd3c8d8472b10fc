"""What the report reads: run folders -> runs and tasks, like compared with like, and
whether the runs' tokenizers let validation compare by loss or only by bits per byte.

runs.py        run folders -> runs, tasks, scale groups; a metric's direction
match.py       like with like: finals at equal tokens, scores over identical item sets
tokenizers.py  the runs' tokenizers compared: bits per byte where they differ, on the same text only
flops.py       a run's FLOPs per token from its config.json, without torch (runs from before summary.json had it)
compute_points.py  one arm at several budgets: the main runs apart from the compute points of the multipliers
"""
