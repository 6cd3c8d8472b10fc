"""Which signal to trust (report.json's series "quality", across_scales, scale_pairs, subject_floor,
recommendation): each metric's quality figures, its SNR and decision accuracy across scales and for every pair of
scales against their compute, whether a continuous metric tracks its task, and each task's best measured metric.
The decisions (sections/decisions/) take the recommendation as a value.

quality.py   each series' figures: monotonicity, spreads, SNR, distance from chance, the ranking over checkpoints,
             and the criteria they pass
across.py    every task x metric's SNR and decision accuracy from each smaller scale against the task's target at
             the largest (its primary metric), against validation loss, and against itself
ladder.py    decision accuracy for every pair of scales against their compute ratio (report["scale_pairs"]), and
             where a drifting hyperparameter held fixed across the scales mixes the comparisons with tuning
tracking.py  whether a continuous metric tracks its task (target DA, or correlation with its accuracy)
choose.py    each task's best measured metric (every metric a candidate, judged by signal and noise), the suite,
             and the aggregate over the decision metrics (aggregate_over: what the decisions rest on after the primary)
subjects.py  groups (MMLU subjects) below an SNR floor, left out of their task's average (new runs and tasks)
render.py    its text: Task quality, Groups left out, Which signal to trust at which scale, Decision accuracy
             against compute, Recommendation
figures.py   its plot: decision accuracy against the compute ratio
"""
