"""Optimizer state in a shape that does not depend on the world size, and what each rank holds.

A multi-process train stage (``train.world_size`` > 1) keeps its AdamW state sharded: ZeRO-1/2 split it over
the data-parallel ranks, ZeRO-3 the weights as well, AutoTP splits the layers' weights and their state over
the tensor-parallel ranks. The stored form gathers it per parameter name — ``{"format": UNIVERSAL, "step":
int, "exp_avg": {name: full tensor}, "exp_avg_sq": {...}}`` — the idea of DeepSpeed's universal checkpoint,
written by rank 0 as one file that cannot carry code (``rl_core.artifacts.safe_state``). Loading scatters it
back into whatever layout the engine has now, so a run continues bit for bit at the same world size and
continues at another one (the fp32 weights themselves are the checkpoint folder). Every function here is a
collective: all ranks call it.

    data = gather_optimizer_state(engine)        # bytes on rank 0, None elsewhere
    scatter_optimizer_state(engine, data)        # on every rank of the new engine
"""

from __future__ import annotations

import resource
from typing import Any

import torch
import torch.distributed as dist

from rl_core.artifacts import safe_state

UNIVERSAL = "rlfoundry-universal-adamw-v1"
KEYS = ("exp_avg", "exp_avg_sq")


def is_universal(state: Any) -> bool:
    return isinstance(state, dict) and state.get("format") == UNIVERSAL


def _tp_group() -> Any:
    from deepspeed.utils import groups

    return groups.get_tensor_model_parallel_group()


def _split_dim(local: torch.Size, full: torch.Size) -> int | None:
    """The dimension AutoTP split a parameter along (its local shard is narrower there), or None."""
    dims = [d for d, (a, b) in enumerate(zip(local, full, strict=True)) if a != b]
    return dims[0] if dims else None


def _state_of(ds: Any, p: torch.nn.Parameter, key: str) -> torch.Tensor:
    """The data-parallel-full (still tensor-parallel-local) ``key`` state of parameter ``p``: maybe the
    engine's own tensor, which ``gather_optimizer_state`` serializes at once (``safe_state.dumps`` copies)."""
    if ds.cfg.zero_stage == 0:
        return ds.optimizer.state[p][key].detach()
    from deepspeed.utils import safe_get_full_optimizer_state

    return safe_get_full_optimizer_state(p, key).detach().cpu()


def _step_of(ds: Any) -> int:
    base = ds.optimizer if ds.cfg.zero_stage == 0 else ds.optimizer.optimizer
    steps = {int(s["step"]) for s in base.state.values() if "step" in s}
    return steps.pop() if len(steps) == 1 else 0


def _tp_full(ds: Any, name: str, t: torch.Tensor) -> torch.Tensor:
    dim = _split_dim(t.shape, ds.full_shapes[name]) if ds.tp_size > 1 else None
    if dim is None:
        return t
    shards: list[Any] = [None] * ds.tp_size
    dist.all_gather_object(shards, t, group=_tp_group())
    return torch.cat(shards, dim=dim)


def gather_optimizer_state(ds: Any) -> bytes | None:
    """The engine's AdamW state, whole, per parameter name: bytes on rank 0, None on the other ranks."""
    out: dict[str, Any] = {"format": UNIVERSAL, "step": _step_of(ds), **{k: {} for k in KEYS}}
    for name, p in ds.engine.module.named_parameters():
        for key in KEYS:
            out[key][name] = _tp_full(ds, name, _state_of(ds, p, key))
    if dist.get_rank() != 0:
        return None
    return safe_state.dumps(out)


def _tp_local(ds: Any, name: str, p: torch.nn.Parameter, full: torch.Tensor) -> torch.Tensor:
    """This tensor-parallel rank's slice of a whole state tensor (the shard sizes are the ranks' own)."""
    dim = _split_dim(p.shape, full.shape) if ds.tp_size > 1 else None
    if dim is None:
        return full
    sizes: list[Any] = [None] * ds.tp_size
    dist.all_gather_object(sizes, p.shape[dim], group=_tp_group())
    me = dist.get_rank(group=_tp_group())
    return full.narrow(dim, sum(sizes[:me]), sizes[me]).clone()


def _ensure_state(ds: Any) -> None:
    """Create AdamW's state (zeros, as its first step would) on the ZeRO partitions not stepped yet, and
    link the parameters to it, so that it can be overwritten before the first step. ZeRO-1/2 keep their flat
    fp32 partitions in the optimizer's param groups; ZeRO-3 puts them there only around its own step
    (``fp32_partitioned_groups_flat`` the rest of the time), and keys its state by them."""
    base = ds.optimizer.optimizer
    flats = getattr(ds.optimizer, "fp32_partitioned_groups_flat", None)  # ZeRO-3
    if flats is None:
        flats = [p for group in base.param_groups for p in group["params"]]
    for p in flats:
        if not base.state.get(p):
            zero = torch.zeros((), dtype=torch.float32)
            base.state[p] = {"step": zero, **{k: torch.zeros_like(p) for k in KEYS}}
    link = getattr(ds.optimizer, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-1/2
    if link is not None:
        link()


def scatter_optimizer_state(ds: Any, state: dict[str, Any]) -> None:
    """Put a gathered state (``gather_optimizer_state``, loaded) into the engine's current layout."""
    params = dict(ds.engine.module.named_parameters())
    missing = sorted(set(params) - set(state["exp_avg"]))
    if missing:
        raise ValueError(f"optimizer state has no entry for parameters {missing[:5]} (another model?)")
    step = torch.tensor(float(state["step"]))
    if ds.cfg.zero_stage != 0:
        _ensure_state(ds)
    for name, p in params.items():
        values = {k: _tp_local(ds, name, p, state[k][name]) for k in KEYS}
        if ds.cfg.zero_stage == 0:
            ds.optimizer.state[p] = {"step": step.clone(), **values}
            continue
        from deepspeed.utils import safe_set_full_optimizer_state

        for k, v in values.items():
            safe_set_full_optimizer_state(p, v.to(p.device), k)
    if ds.cfg.zero_stage != 0:
        for s in ds.optimizer.optimizer.state.values():
            s["step"] = step.clone()


def memory_report(ds: Any) -> dict[str, float]:
    """What each rank holds, in MB: parameters (ZeRO-3: its partition; AutoTP: its shards), optimizer state,
    and the process's peak resident memory; plus the whole model's parameters for comparison. Collective."""

    def mb(n: float) -> float:
        return round(n / 2**20, 3)

    params = sum(
        (p.ds_tensor.numel() * p.ds_tensor.element_size() if hasattr(p, "ds_tensor") else p.numel() * 4)
        for p in ds.engine.module.parameters()
    )
    base = ds.optimizer if ds.cfg.zero_stage == 0 else ds.optimizer.optimizer
    optim = sum(
        t.numel() * t.element_size() for s in base.state.values() for t in s.values() if torch.is_tensor(t)
    )
    mine = [mb(params), mb(optim), round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    out = {"model_params_mb": mb(sum(s.numel() * 4 for s in ds.full_shapes.values()))}
    for r, (p, o, rss) in enumerate(every):
        out |= {f"rank{r}_params_mb": p, f"rank{r}_optimizer_mb": o, f"rank{r}_peak_rss_mb": rss}
    return out
