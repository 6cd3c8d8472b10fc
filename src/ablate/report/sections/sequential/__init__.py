"""An adaptive study (ablate run --until-decided): the report's `sequential` section and what the study's driver
(launch/study.py) and `ablate status` read of the report, nothing else.

rule.py       the decision rule (DecisionRule, `from ablate import DecisionRule` reads this module alone), its budget,
              the decision metrics' names, the fields that may change after results (voids_guarantee)
decide.py     each contrast decided under its design (anytime or group-sequential), Holm's recycling over the
              contrasts (decide_study), the seeds a next round gives (open_variants)
contrasts.py  the study's contrasts from its loaded runs, read as the fixed report reads them, in the order trained
words.py      a contrast in one line (the driver's and `ablate status`'s) and the futility text
section.py    report.json's `sequential`: read_study (inputs/study.py's record, its rule checked), the contrasts,
              rule and its history, rounds and compute;
              folder_contrasts, the contrasts of the runs under a folder (what the driver asks after each round)
render.py     report.json's `sequential` -> the Adaptive study section of report.md and report.html
headline.py   the study's decisions leading the headline; the fixed-n tests' label under optional stopping
"""
