"""The store and what it holds: the artifact store (file:// or s3:// through fsspec), its locks, stage
manifests (the commit marker of a stage), state files that cannot carry code, the stage runner (``run_stage``:
done, resumed or redone), and the small helpers every stage uses (paths, derived seeds, fault injection,
progress events).

May import: schema.
"""
