"""Where the engines other than the in-process policy engine go (rl_core/models/placement.py): the rollout
servers (`rollout.servers`, `rlfoundry up --rollout-servers`) get the same device arguments as the in-process
engine, spelled as `vllm serve` flags that vLLM's own parser reads back, and on a GPU machine each its share
of `rollout.gpus`; the LLM judge's engine sits beside the policy's with its own memory share and sleeps with
it; an engine on GPUs that are not the process's first ones gets a process of its own that sees only them. No
GPU
and no server process needed: machines are described by name."""

from __future__ import annotations

import pytest

from infra.rollout_servers import RolloutServers
from rl_core.models.placement import Machine, PlacementError, plan
from rl_core.models.vllm_args import cpu_vllm_args, cuda_visible, rollout_server_args, vllm_flags
from rl_core.schema.config import config_from_dict

CPU = Machine(cpu_bf16=True)
FOUR_H200 = Machine.described("H200", 4)
JUDGED = {"weights": {"correct": 1.0, "judge": 0.5}, "judge": {"model": "/judge"}}


def _cfg(**sections):
    return config_from_dict({"experiment": {"name": "t"}, **sections})


def _parsed(flags: list[str]) -> dict:
    """What vLLM's own command line makes of ``flags`` (the parser `vllm serve` uses; parsed only, so no
    model is looked up)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    return vars(parser.parse_args(["--model", "m", *flags]))


@pytest.mark.slow  # imports vLLM's argument parser (seconds; the rest of this file imports no vLLM)
@pytest.mark.parametrize(
    "machine, sections",
    [
        (CPU, {}),
        (FOUR_H200, {}),  # colocated: sleep mode on
        (FOUR_H200, {"rollout": {"gpus": [2, 3], "servers": 1, "cuda_graphs": False}}),
        (FOUR_H200, {"rollout": {"gpus": [3], "chunked_prefill": False}}),
    ],
)
def test_server_flags_are_the_in_process_engines_arguments(machine, sections):
    placed = plan(_cfg(**sections), machine)
    args = placed.vllm
    got = _parsed(vllm_flags(args))
    assert {k: got[k] for k in args} == args


def test_cpu_servers_keep_the_cpu_command():
    cfg = _cfg()
    servers = RolloutServers("/ckpt", cfg.rollout, max_model_len=64, placement=plan(cfg, CPU))
    cmd = servers._command(8001)
    # what the servers ran with before placement: eager, no chunked prefill, 256 x the context, the KV cache
    for flags in (
        ["--enforce-eager"],
        ["--no-enable-chunked-prefill"],
        ["--max-num-batched-tokens", str(256 * 64)],
        ["--kv-cache-memory-bytes", str(cfg.rollout.kv_cache_mb << 20)],
    ):
        at = cmd.index(flags[0])
        assert cmd[at : at + len(flags)] == flags
    assert not any("gpu-memory" in c or "tensor-parallel" in c for c in cmd)
    # the one source of a server's options (Kubernetes' pods use it too): the run's own values, the flags
    want = rollout_server_args(
        host="127.0.0.1",
        port=8001,
        dtype="float32",
        max_model_len=64,
        device_flags=vllm_flags(servers.device_args),
    )
    assert cmd[cmd.index("--served-model-name") :] == want
    assert servers.gpus == () and "CUDA_VISIBLE_DEVICES" not in servers._env(0)
    # the model in the engine core's process: vLLM's CPU platform starts a worker process of its own otherwise
    assert servers._env(0)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # without a placement (a caller that has none): the same CPU arguments
    bare = RolloutServers("/ckpt", cfg.rollout, max_model_len=64)
    assert bare.device_args == cpu_vllm_args(64, cfg.rollout.kv_cache_mb) == servers.device_args


def test_gpu_servers_split_the_engine_gpus_and_see_only_their_own(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as an in-process engine of this one sets it
    cfg = _cfg(train={"world_size": 1}, rollout={"gpus": [1, 2, 3], "servers": 3})
    placed = plan(cfg, FOUR_H200)
    assert placed.server_gpus == ((1,), (2,), (3,)) and placed.trainer_gpus == (0,)
    servers = RolloutServers("/ckpt", cfg.rollout, max_model_len=256, placement=placed)
    cmd = servers._command(8001)
    assert {"--gpu-memory-utilization", "--no-enforce-eager", "--enable-chunked-prefill"} <= set(cmd)
    assert "--kv-cache-memory-bytes" not in cmd and "--no-enable-sleep-mode" in cmd  # own GPUs: no sleep
    assert [servers._env(i)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["1", "2", "3"]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in servers._env(0)  # on a GPU: vLLM's own default
    # two servers over two GPUs each: tensor parallel 2
    two = plan(_cfg(rollout={"gpus": [0, 1, 2, 3], "servers": 2}), Machine.described("H200", 5))
    assert two.server_gpus == ((0, 1), (2, 3)) and two.vllm["tensor_parallel_size"] == 2
    # a process that itself sees only some GPUs: the servers' indices mapped through its own
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert servers._env(2)["CUDA_VISIBLE_DEVICES"] == "7"


@pytest.mark.parametrize(
    "rollout, match",
    [
        ({"servers": 2}, r"rollout.servers=2 .* multiple of 2 .* rollout.gpus=\[\]"),
        ({"servers": 2, "gpus": [1, 2, 3]}, r"multiple of 2 GPUs"),
    ],
)
def test_servers_without_gpus_of_their_own_are_refused_on_a_gpu_machine(rollout, match):
    with pytest.raises(PlacementError, match=match):
        plan(_cfg(rollout=rollout), FOUR_H200)


def test_on_cpu_servers_share_the_cpu_as_before():
    assert plan(_cfg(rollout={"servers": 2}), CPU).server_gpus == ()


def test_the_judge_engine_sits_beside_the_policy_engine_and_sleeps_with_it():
    assert plan(_cfg(reward=JUDGED), CPU).judge_engine() is None  # CPU: its own context length, as before
    placed = plan(_cfg(reward=JUDGED, train={"dtype": "bf16", "zero_stage": 1}), FOUR_H200)
    judge = placed.judge_engine()
    assert judge is not None and judge.rollout_gpus == (0,)
    assert judge.workloads["rollout"] == placed.workloads["judge"]
    assert (judge.workloads["rollout"].device, judge.workloads["rollout"].dtype) == ("cuda:0", "bfloat16")
    assert judge.vllm["gpu_memory_utilization"] == 0.1 and judge.vllm["enable_sleep_mode"] is True
    assert judge.vllm["tensor_parallel_size"] == 1 and not judge.engine_processes
    # its share is in the memory plan of that GPU: whole while generating, a process reserve while training
    gpu = placed.memory["gpus"]["0"]
    plain = plan(_cfg(train={"dtype": "bf16", "zero_stage": 1}), FOUR_H200).memory["gpus"]["0"]
    assert gpu["judge_gib"] == pytest.approx(0.1 * 139.8, abs=0.01)
    generate = plain["generate_phase_gib"] + gpu["judge_gib"]
    assert gpu["generate_phase_gib"] == pytest.approx(generate, abs=0.02)
    assert gpu["train_phase_gib"] == pytest.approx(plain["train_phase_gib"] + 2.0, abs=0.02)


def test_a_judge_share_that_does_not_fit_is_refused_before_any_work():
    rollout = {"gpu_memory_utilization": 0.9, "reward_gpu_memory_utilization": 0.5}
    with pytest.raises(PlacementError, match="generate phase"):
        plan(_cfg(reward=JUDGED, rollout=rollout), FOUR_H200)


def test_an_engine_on_gpus_of_its_own_runs_in_a_process_that_sees_only_them():
    assert not plan(_cfg(), FOUR_H200).engine_processes  # colocated on GPU 0: in this process
    assert not plan(_cfg(), CPU).engine_processes
    own = plan(_cfg(rollout={"gpus": [3]}), FOUR_H200)
    assert own.engine_processes and own.rollout_gpus == (3,)
    assert plan(_cfg(rollout={"gpus": [0, 1]}), FOUR_H200).engine_processes  # tensor parallel
    assert cuda_visible((3,), {}) == "3" and cuda_visible((0, 1), {"CUDA_VISIBLE_DEVICES": "2,6"}) == "2,6"


def test_the_engine_is_started_with_those_gpus(monkeypatch):
    import os

    from rl_core.generation import rollout
    from rl_core.models import vision, vllm_args

    seen = {}

    def init(self, ckpt_dir, *, dtype, max_model_len, device_args, multiprocess, gpus=()):
        seen.update(gpus=gpus, multiprocess=multiprocess, device_args=device_args)

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(vision, "check_vllm_runs", lambda _: None)
    monkeypatch.setattr(rollout.VLLMEngine, "__init__", init)
    cfg = _cfg(rollout={"gpus": [2, 3]})
    rollout.start_engine("vllm", "/ckpt", cfg.rollout, max_model_len=64, placement=plan(cfg, FOUR_H200))
    assert seen["gpus"] == (2, 3) and seen["multiprocess"] is True
    assert seen["device_args"]["tensor_parallel_size"] == 2
    # what vLLM's engine core inherits while it is spawned, and this process's setting afterwards
    with vllm_args.visible_gpus((2, 3)):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    with vllm_args.visible_gpus((2, 3)):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    # the colocated engine: in this process, no GPU setting of its own
    colocated = plan(_cfg(), FOUR_H200)
    rollout.start_engine("vllm", "/ckpt", _cfg().rollout, max_model_len=64, placement=colocated)
    assert seen["gpus"] == () and seen["multiprocess"] is False


def test_on_cpu_a_judge_or_gpu_field_changes_nothing():
    cfg = _cfg(reward=JUDGED, rollout={"reward_gpu_memory_utilization": 0.3})
    placed = plan(cfg, CPU)
    assert placed.judge_vllm == {} and placed.server_gpus == () and placed.judge_engine() is None
    assert placed.vllm == plan(_cfg(), CPU).vllm


def _reward_server(tmp_path, monkeypatch, placement):
    from infra import reward_server

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 96}')
    monkeypatch.setattr(reward_server, "check_reward_folder", lambda p: tmp_path)
    return reward_server.RewardServer(tmp_path, kv_cache_mb=32, placement=placement)


def test_the_reward_server_keeps_its_cpu_command_and_gets_a_share_on_a_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rewarded = {"weights": {"correct": 1.0, "reward_model": 0.5}, "model": {"path": "/rm"}}
    cpu = _reward_server(tmp_path, monkeypatch, plan(_cfg(reward=rewarded), CPU))
    cmd = cpu._command(8002)
    # the command it always had on the CPU: eager, a 32 MiB KV cache, 256 x its context per step
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(32 << 20) and "--enforce-eager" in cmd
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == str(max(8192, 256 * 96))
    assert (
        not any("chunked" in c or "gpu-memory" in c for c in cmd) and "CUDA_VISIBLE_DEVICES" not in cpu._env()
    )
    placed = plan(_cfg(reward=rewarded, rollout={"gpus": [3]}), FOUR_H200)
    gpu = _reward_server(tmp_path, monkeypatch, placed)
    cmd = gpu._command(8002)
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.1" and "--no-enable-chunked-prefill" in cmd
    assert "--kv-cache-memory-bytes" not in cmd and gpu._env()["CUDA_VISIBLE_DEVICES"] == "3"
    assert cpu._env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in gpu._env()
    # it is in that GPU's memory plan, awake in both phases
    entry = placed.memory["gpus"]["3"]
    assert entry["reward_server_gib"] == pytest.approx(13.98, abs=0.01)
    # a reward model reached at a URL is not the flow's to place
    at_url = {**rewarded, "model": {"path": "/rm", "url": "http://10.0.0.2:8000"}}
    assert (
        "reward_server_gib"
        not in plan(_cfg(reward=at_url, rollout={"gpus": [3]}), FOUR_H200).memory["gpus"]["3"]
    )
