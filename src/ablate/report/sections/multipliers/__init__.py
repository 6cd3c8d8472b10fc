"""Compute multipliers on a ladder (report["multipliers"]): each variant's effect in the currency of compute, read
off the baseline's loss-vs-compute curve per rung, with its text and plots.

baseline_curve.py  the baseline's curve per rung: its fit, the test of its form, the local quadratic where it fails
estimate.py   compute multipliers on a ladder, their intervals, their ratios across budgets and trend across rungs
checks.py     beside them: a projection along the trend (when asked), the seed bootstrap check
section.py    report["multipliers"] from them: the arms named as the report names them, each variant at its main
              budget, its other budgets beside it
render.py     report["multipliers"] -> the headline's compute sentence and the Compute multipliers section
figures.py    its plots: loss vs FLOPs per rung with the matched-loss arrows, M vs compute
"""
