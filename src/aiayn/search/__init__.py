"""The one search (§6.1): greedy, batched beam search and sampling over a narrow model
interface (`decode`; `step` holds what every step shares, `rows` the one-hypothesis-per-row
search that rows may join while it runs), what a search returns and how it is scored
(`hypothesis`), how sampling draws (`sampling`), the bounds of its settings and the output
lengths they imply (`limits`), and what an observer sees of every step (`views`): the glass
box watches this search, never a copy.
"""
