"""Classifying texts with an encoder-only model: in-process inference and its metrics.

classifier   Classifier: a model directory's classifier, texts in, probabilities out
metrics      accuracy, macro-F1, per-class scores, the confusion matrix, bootstrap intervals
"""
