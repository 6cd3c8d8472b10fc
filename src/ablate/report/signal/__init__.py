"""Which signal to trust: each metric's SNR and decision accuracy across scales, whether a continuous metric tracks
its task, and each task's best measured metric.

across.py    every task x metric's SNR and decision accuracy from each smaller scale against the task's target at
             the largest (its primary metric), against validation loss, and against itself
tracking.py  whether a continuous metric tracks its task (target DA, or correlation with its accuracy)
choose.py    each task's best measured metric (every metric a candidate, judged by signal and noise); the series
             the decisions rest on after the primary metric (suite_series: decisions take the recommendation)
subjects.py  groups (MMLU subjects) below an SNR floor, left out of their task's average
"""
