"""A run: its context (the config, the store, the placement and the engines held between stages), its record
(create, resume, config versions) and its lineage in MLflow.

May import: schema, artifacts, models.
"""
