"""Runs built by grid() (config.json "axes") laid out on their axes (report["sweep"]): the cells, the heatmap, the
optimum LR and its drift across sizes, the batch size and the model size, with their text and plots.

section.py  report["sweep"] from the runs: the axes, the runs left out and why, the score and where it is read,
            the views the axes allow (sweep_section)
cells.py    the grid's cells (seeds averaged), grouped by a context, and the heatmap over two axes
views.py    the score against LR per context with its optimum; the optimum's drift along each size axis; the best
            cell per model size with L(N) and the smaller sizes' rankings
batch.py    the batch-size view: loss curves per batch size at its best LR, steps and tokens to target losses,
            their fits and CIs with seeds resampled
fits.py     the fits, pure functions of arrays: optimum LR, its drift across scales, critical batch, WSD E(S), the
            power law (its least squares in stats/power_law.py, which the multipliers' baseline curve shares)
render.py   report["sweep"] -> the Sweep sections of report.md and report.html
figures.py  their plots: heatmap, score against LR, loss curves per batch size, E vs S, score against model size,
            optimum against size
"""
