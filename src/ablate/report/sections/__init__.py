"""The report's sections, one folder each, owning its computation and its rendering (issue 46: the others follow).

decisions/    which variant wins and how sure: each pair over seeds, the two families, the winner, the headline,
              the report's opening and each scale's final scores
sequential/   an adaptive study (ablate run --until-decided): its rule, decisions and contrasts, the report's section
              and its words (the only part of the report launch/study.py imports)
multipliers/  compute multipliers on a ladder: the baseline's curve per rung, the multipliers, their checks, the
              report's section, its text and plots
signal/       which signal to trust: each series' quality figures, SNR and decision accuracy across scales, the
              subject floor, each task's best measured metric (the recommendation), and their text
sweep/        runs built by grid() on their axes: cells, heatmap, optimum LR, batch size, model size, their fits,
              text and plots
tokenizers/   runs of different tokenizers: what validation is compared by, the runs table's tokenizer columns
"""
