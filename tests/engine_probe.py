"""The in-process vLLM engine's completions of a batch, for a test that compares another engine with it (run
by tests/integration/test_rollout_servers.py in a process of its own: a second vLLM engine in a pytest worker
would re-create torch.distributed's world under a later DeepSpeed engine of the same worker). Reads one JSON
file {"ckpt", "reqs": [[prompt_ids, seed], ...], "spec": SamplingSpec's fields}; prints one JSON line: per
request, per completion [token_ids, logprobs, finish_reason].

    python tests/engine_probe.py ARGS.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argfile: str) -> None:
    from rl_core.generation.rollout import Request, SamplingSpec, VLLMEngine
    from rl_core.models.vllm_args import cpu_vllm_args

    a = json.loads(Path(argfile).read_text())
    eng = VLLMEngine(
        a["ckpt"], dtype="float32", max_model_len=256, device_args=cpu_vllm_args(256, 64), multiprocess=False
    )
    out = eng.generate([Request(r[0], r[1]) for r in a["reqs"]], SamplingSpec(**a["spec"]))
    print(json.dumps([[[c.token_ids, c.logprobs, c.finish_reason] for c in cs] for cs in out]))


if __name__ == "__main__":
    main(sys.argv[1])
