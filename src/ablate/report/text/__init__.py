"""The report in words and pictures: the headline's sentences, report.json -> report.md and report.html, the plots.

fmt.py         what the text shares: the Section, numbers as shown, markdown escaping
headline.py    one sentence per decision metric, the headline; an adaptive study's decisions leading it
verdict.py     the verdict in one or two sentences, and the decisions table (a row per decision metric)
opening.py     the report's opening: the verdict, the decisions table, the method once and folded away
render.py      report.json -> report.md and report.html (the sections in order, sections/' among them)
plots.py       the embedded PNGs (matplotlib, Agg)
"""
