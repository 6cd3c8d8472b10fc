"""How sure: the study's error control and the decisions' statistics (the pure statistics they rest on are in stats/;
an adaptive study's rule and decisions are sections/sequential/).

pairs.py       one pair of variants tested over training seeds; a series' leader from its pairs
families.py    the two families (primary metric, task metrics), the decision metrics, the winner, failed seeds
"""
