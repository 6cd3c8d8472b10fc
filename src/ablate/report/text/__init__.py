"""The report's text: what every section's words and pictures share, and the page that assembles the sections.

fmt.py         what the text shares: the Section, numbers as shown, markdown escaping
plots.py       the embedded PNGs (matplotlib, Agg)
render.py      report.json -> report.md and report.html (the sections in order, sections/' own among them; the
               overview and the curves)
"""
