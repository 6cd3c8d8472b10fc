"""How sure: seed-level tests under one noise model, the study's error control, the decisions' statistics, an
adaptive study's rule under either design, and the report calibrated on studies with known answers.

stats.py       seed-level tests and their t intervals (seeds + item-set noise), Benjamini-Hochberg, seeds needed,
               Spearman, Kendall, SNR, decision accuracy (numpy/scipy)
pairs.py       one pair of variants tested over training seeds; a series' leader from its pairs
families.py    the two families (primary metric, task metrics), the decision metrics, the winner, failed seeds
da.py          decision accuracy's bootstrap (variants sharing a seed resampled together, the items shared by every
               seed resampled once per replicate) and its coverage
sequential.py  adaptive studies (ablate run --until-decided): the decision rule, each contrast decided under its
               design, Holm's recycling over the contrasts (numpy/scipy only when a study is read)
study_section.py  the report's `sequential` section: the study's contrasts from its run folders, its rule, rounds
               and compute
group_sequential.py  the default design: alpha spending over the looks, boundaries calibrated for the t,
               repeated intervals, non-binding futility
anytime.py     the anytime design: the safe t-test's e-values and confidence sequences
"""
