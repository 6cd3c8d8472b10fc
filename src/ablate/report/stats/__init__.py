"""Pure statistics: functions of numbers and arrays that know nothing of runs, run folders, tasks or the report's
options; they import nothing of ablate.report outside this folder (tests/test_structure.py).

describe.py    rank correlations (Spearman, Kendall), decision accuracy, signal-to-noise, sd, distance from chance
noise.py       the noise model of a difference (seeds + item-set noise), t intervals, the seed test, the item-level p
power.py       Benjamini-Hochberg, the t-test's power, seeds needed (and the item set's limit), the sd's range
da.py          decision accuracy's bootstrap (variants sharing a seed resampled together, the items shared by every
               seed resampled once per replicate) and its coverage
group_sequential.py  the default adaptive design: alpha spending over the looks, boundaries calibrated for the t,
               repeated intervals, non-binding futility
anytime.py     the anytime design: the safe t-test's e-values and confidence sequences
power_law.py   L(N) = E + A N^-alpha by least squares (E free or pinned): the sweep's model sizes, the multipliers'
               baseline curve
"""
