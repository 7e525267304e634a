"""Prefect layer of rlfoundry; importing it sets the process defaults (state dir, quiet logs, no telemetry)."""

from rl_core.paths import configure_env

configure_env()
