"""Running rlfoundry: the local stack (``infra.localstack``, behind ``rlfoundry up`` / ``down``) beside the
documents and manifests for running it at scale (``infra/README.md``). The RL library (``rl_core``) never
imports this package; the command line and the tests do."""
