"""The report's sections, one folder each, owning its computation and its rendering (issue 46: the others follow).

sequential/   an adaptive study (ablate run --until-decided): its rule, decisions and contrasts, the report's section
              and its words (the only part of the report launch/study.py imports)
multipliers/  compute multipliers on a ladder: the baseline's curve per rung, the multipliers, their checks, the
              report's section, its text and plots
sweep/        runs built by grid() on their axes: cells, heatmap, optimum LR, batch size, model size, their fits,
              text and plots
"""
