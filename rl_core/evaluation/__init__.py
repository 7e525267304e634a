"""Evaluation: greedy accuracy on held-out tasks and unbiased pass@k from sampled completions (the evaluate
stage's body).

May import: schema, artifacts, models, run, generation, training, scoring.
"""
