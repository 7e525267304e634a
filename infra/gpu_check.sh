#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a machine with one CUDA GPU, CUDA torch and transformers but no
# network and no vLLM: DeepSpeed's train stage and the HF engine in bf16 on Qwen2.5-0.5B's shape, padded and
# packed, beside the bare peer (plain transformers generate, a plain PyTorch PPO update) at the default size
# and at --large (1,024 sequences, ~475k tokens per update), a line per phase as it goes; sized for at most
# 8 minutes on an H200 (not yet run on a GPU since the large size and the bare peer were added). Prepare the
# wheels first where pip works (make gpu-wheels: .whl/), carry the checkout and .whl/ there, and run from the
# repository root:
#
#     bash infra/gpu_check.sh            # result: $OUT/gpu_check.json when OUT is set, else benchmarks/results/
#
# GPU_CHECK_ARGS replaces the default arguments (--large; e.g. "--prompts 32" for a quick default size only);
# GPU_CHECK_TIMEOUT (seconds, default 480) bounds the run (the default size's figures are in the result file
# before the large size starts, so a run it stops keeps them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check: no wheels in .whl/ (run make gpu-wheels where pip works)"; exit 2; }
site=$(mktemp -d /tmp/rlf-gpu-site.XXXXXX)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
export RLFOUNDRY_STATE_DIR="${RLFOUNDRY_STATE_DIR:-$(mktemp -d /tmp/rlf-gpu-state.XXXXXX)}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import torch, transformers, deepspeed; print("torch", torch.__version__, "cuda", torch.version.cuda,
"transformers", transformers.__version__, "deepspeed", deepspeed.__version__)'
out="${OUT:-benchmarks/results}/gpu_check.json"
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of arguments
timeout "${GPU_CHECK_TIMEOUT:-480}" "$PY" benchmarks/gpu_check.py --json --out "$out" ${GPU_CHECK_ARGS:---large}
echo "gpu_check: wrote $out"
