"""An arithmetic environment whose step SIGKILLs its own worker process, as the kernel's OOM killer would: the
first step after ``DYING_ENV_MARKER`` names a missing file (which the step then creates: one death), or every
step when ``DYING_ENV_ALWAYS=1``. Named ``tests.dying_env:DyingEnv`` in ``task.env``."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from envs.arithmetic import ArithmeticEnv
from envs.base import StepResult


class DyingEnv(ArithmeticEnv):
    name = "dying"

    def step(self, action: str) -> StepResult:
        marker = os.environ.get("DYING_ENV_MARKER")
        if os.environ.get("DYING_ENV_ALWAYS") == "1" or (marker and not Path(marker).exists()):
            if marker:
                Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)
