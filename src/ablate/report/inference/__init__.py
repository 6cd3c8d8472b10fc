"""How sure: the study's error control, the decisions' statistics, an adaptive study's rule under either design and
its section of the report (the pure statistics they rest on are in stats/).

pairs.py       one pair of variants tested over training seeds; a series' leader from its pairs
families.py    the two families (primary metric, task metrics), the decision metrics, the winner, failed seeds
sequential.py  adaptive studies (ablate run --until-decided): the decision rule, each contrast decided under its
               design, Holm's recycling over the contrasts (numpy/scipy only when a study is read), a contrast in one
               line (the driver's and `ablate status`'s)
study_section.py  the report's `sequential` section: the study's contrasts from its runs, its rule, rounds and compute
"""
