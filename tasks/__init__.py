"""Prefect layer of rlfoundry; importing it sets process defaults (state dir, quiet logs, no telemetry)."""

from rl_core.artifacts.paths import configure_env

configure_env()
