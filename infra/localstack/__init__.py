"""The local stack and every server process rlfoundry starts on this machine, all on 127.0.0.1.

- ``process``: the one way a server is started and supervised (own log file, health wait, identity by pid and
  create time, stop by process group, optionally tied to its parent's life).
- ``prefect_server``: the Prefect API server (one configuration; UI on or off), and ``ensure_api`` for a run's
  private one.
- ``s3_server``: SeaweedFS as an S3 server.
- ``stack``: ``rlfoundry up`` / ``down``: S3, Prefect and MLflow together, state under ``<state dir>/stack``.

    from infra.localstack.stack import up, down
"""
