"""Text in: the joint SentencePiece `Tokenizer` (and an imported Marian model's), parallel
corpora read and checked, token-budget batches (§5.1), a run's data, `aiayn data check`, and
the built-in synthetic corpora.
"""
