"""The decisions: which variant wins and how sure, from each pair tested over training seeds to the headline that
opens the report (the pure statistics they rest on are stats/; the recommendation of which metric to decide on
reaches them as a value, from sections/signal/).

pairs.py       one pair of variants tested over training seeds; a series' leader from its pairs
families.py    the two families (primary metric, task metrics), the decision metrics, the winner
headline.py    one sentence per decision metric, the headline
verdict.py     the verdict in one or two sentences, and the decisions table (a row per decision metric)
opening.py     the report's opening: the verdict, the decisions table, the method once and folded away
render.py      each scale's final scores: the decision metrics' finals and pairs, every metric's final means
"""
