"""The configuration schema: one pydantic model of an experiment (``Config``), every field with its type,
default, constraints and description, loading YAML with ``--set`` overrides, and the data the schema checks
against (the built-in reward names, the audit's flag names, the algorithms' traits).

May import: nothing of rl_core (the schema is the leaf every other room builds on).
"""
