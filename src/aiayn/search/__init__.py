"""The one search (§6.1): greedy, batched beam search and sampling over a narrow model
interface. `decode` runs them; `step` holds what every step shares; `row_search` (greedy,
sampling) and `beam` are the steppable searches that sentences may join while they run, over
`slots` (joins, the slotted cache); `beam_candidates` the rules of a beam step's 2N candidates;
`hypothesis` what a search returns and how it is scored; `sampling` how a token is drawn;
`limits` the bounds of the settings and the output lengths they imply; `step_view` what an
observer sees of every step: the glass box watches this search, never a copy.
"""
