"""Using a model: `Translator` (files and streams in, one line out per line, token-budget
batches, the model's saved search settings) and the metrics (sacreBLEU BLEU, chrF, length ratio).
"""
