"""Grid runs (built by grid(), config.json "axes") laid out on their axes: report["sweep"] (its sections and plots
are text/grid_sections.py and text/grid_figures.py).

analysis.py  runs -> cells, heatmap, optimum LR, batch-size and model-size views (report["sweep"])
fits.py      the views' fits: optimum LR, critical batch, WSD E(S), power law (numpy/scipy)
baseline_curve.py  the baseline's curve per rung: its fit, the test of its form, the local quadratic where it fails
multipliers.py  compute multipliers on a ladder, their intervals, their ratios across budgets and trend across rungs
multiplier_checks.py  beside them: a projection along the trend (when asked), the seed bootstrap check
compute.py   report["multipliers"] from them (its text and plots: text/multipliers.py, text/multiplier_figures.py)
"""
