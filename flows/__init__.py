"""The Prefect layer; importing it sets the process defaults (state dir, quiet logs, telemetry off)."""

from rl_core.artifacts.paths import configure_env

configure_env()
