"""The glass box: one sentence traced through a model and its search (`explain`), the
explanation's names and classes, text/JSON/HTML renderings, the seeds' worked example
replayed, attention pictures and curves, and the same as inline Jupyter views.
"""
