"""Grid runs (built by grid(), config.json "axes") laid out on their axes: report["sweep"] and its sections.

analysis.py  runs -> cells, heatmap, optimum LR, batch-size and model-size views (report["sweep"])
fits.py      the views' fits: optimum LR, critical batch, WSD E(S), power law (numpy/scipy)
figures.py   their plots, as base64 PNGs (report/plots.py's png())
sections.py  report["sweep"] -> the report's Sweep sections (report/fmt.py's Section)
"""
