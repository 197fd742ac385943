"""The glass box: one sentence traced through a model and its search (`explain`), the trace's
names and classes (`explanation`), a sentence traced with a model's saved settings and what
`aiayn explain` prints (`explain_report`), text/JSON and HTML renderings (`render`,
`render_html`), the seeds' worked example replayed (`seed_example`), attention pictures
(`viz`, `attention_page`), and the same as inline Jupyter views (`notebook`).
"""
