"""The stage table (every stage declared once: its body, inputs, outputs and summary) and what reads a run
back through it: replay of one stage, ``show``, sampled rollouts and lineage walks.

May import: every other room.
"""
