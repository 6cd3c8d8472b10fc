"""Grid runs (built by grid(), config.json "axes") laid out on their axes: report["sweep"] (its sections and plots
are text/grid_sections.py and text/grid_figures.py).

analysis.py  runs -> cells, heatmap, optimum LR, batch-size and model-size views (report["sweep"])
fits.py      the views' fits: optimum LR, critical batch, WSD E(S), power law (numpy/scipy; sections/multipliers/
             fits the baseline's curve with it)
"""
