"""Compute multipliers on a ladder (report["multipliers"]): each variant's effect in the currency of compute, read
off the baseline's loss-vs-compute curve per rung, with its text and plots.

baseline_curve.py  the baseline's curve per rung: its fit, the test of its form, the local quadratic where it fails
estimate.py   compute multipliers on a ladder, rung by rung: data, frontier and wall-clock; their ratios across budgets
intervals.py  their delta-method intervals (seeds the unit), the fitted curve's band, the trend across rungs
floor.py      the curve's floor E where a rung cannot fit it: pinned, shared across rungs and carried, the
              sensitivity check over a range of E
checks.py     beside them: a projection along the trend (when asked), the seed bootstrap check
section.py    report["multipliers"] from them: the arms named as the report names them, each variant at its main
              budget, its other budgets beside it
render.py     report["multipliers"] -> the headline's compute sentence and the Compute multipliers section
figures.py    its plots: loss vs FLOPs per rung with the matched-loss arrows, M vs compute
"""
