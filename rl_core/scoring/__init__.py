"""Rewards as infrastructure: the score stage's body (reward functions, advantages), the served reward model
and its client, the LLM judge (and its training), and the audit against reward hacking.

May import: schema, artifacts, models, run, generation, training.
"""
