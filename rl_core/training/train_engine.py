"""Train engines: DeepSpeed (ZeRO 0-3, gloo on CPU, NCCL on GPU) and plain torch (the reference).

Both expose the same small surface that ``rl_core.training.ppo`` drives: ``module`` (the model, called for
logits), ``backward_step(loss, step) -> grad_norm`` (``step=False`` accumulates the gradients of a micro-batch
into the next step), ``weights()``,
``optimizer_state()``/``load_optimizer_state()``, and ``train(batch) -> metrics``. One process in-flow by
default; under a launcher (``torchrun``/``deepspeed``) each rank builds the same engine and DeepSpeed shards
optimizer state and gradients across ranks.

    engine = make_train_engine("deepspeed", model, train_cfg)
    metrics = engine.train(batch)
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import torch

from rl_core.artifacts import safe_state
from rl_core.artifacts.paths import free_port, torch_extensions_dir


class TrainEngine(Protocol):
    module: Any
    world_size: int
    rank: int

    def train(self, batch: Any) -> dict[str, float]: ...

    def close(self) -> None: ...

    def backward_step(self, loss: torch.Tensor, step: bool = True) -> float: ...

    def weights(self) -> dict[str, torch.Tensor]: ...

    def optimizer_state(self) -> bytes: ...

    def load_optimizer_state(self, data: bytes, what: str = "optimizer state") -> None: ...

    def load_optimizer_tree(self, sd: Any, what: str = "optimizer state") -> None: ...


def build_ops() -> None:
    """Compile the C++ ops DeepSpeed loads when it initialises on this machine (on CPU its shared-memory
    communication op: ~50 s of compiling, once per machine and install, cached under
    ``cache_dir("torch_extensions")``), so that the first train stage of a run does not pay for it (the venv
    set-up and the benchmarks call this; on a GPU there is nothing to build)."""
    os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()


def init_distributed() -> None:
    """Join the launcher's process group, or make a world of one on 127.0.0.1 when run in-flow."""
    import torch.distributed as dist

    os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    if dist.is_initialized():
        # An in-process vLLM engine already made a world of one; DeepSpeed joins it.
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(k, v)
    elif "RANK" not in os.environ:
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
        )
    import deepspeed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


def _adamw(model: Any, cfg: Any) -> torch.optim.Optimizer:
    """Torch's AdamW (not DeepSpeed's cpu_adam/fused_adam: a ~150 s C++ build on CPU). On the CPU its fused
    kernel, as transformers' Trainer (and so TRL) uses by default: one pass over each tensor instead of a
    dozen elementwise ops (benchmarks/train_step.py); elsewhere torch's own default."""
    params = list(model.parameters())
    on_cpu = all(p.device.type == "cpu" for p in params)
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        betas=(0.9, 0.999),
        eps=1e-8,
        fused=True if on_cpu else None,
    )


def clip_gradients(params: Any, max_norm: float) -> float:
    """Scale the gradients to a total L2 norm of at most ``max_norm`` with foreach kernels; the norm before
    clipping."""
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True))


def _device(device: str | None) -> torch.device | None:
    """The device a rank trains on: ``device`` as placed (rl_core.models.placement), else this rank's GPU when
    there is one (cuda:LOCAL_RANK of the GPUs the launcher made visible), else None (CPU)."""
    if device is not None:
        return None if device == "cpu" else torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return None


def _ds_config(cfg: Any, dp_world: int, *, own_clip: bool, bf16: bool) -> dict[str, Any]:
    """DeepSpeed's config for one engine: the mini-batch split over the data-parallel ranks, ZeRO's stage,
    tensor parallelism and bf16 as the train config asks."""
    ds_config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": max(1, cfg.micro_batch_size // dp_world),
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0 if own_clip else cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if cfg.tp_size > 1:
        ds_config["tensor_parallel"] = {"autotp_size": cfg.tp_size}
    if bf16:
        ds_config["bf16"] = {"enabled": True}
    return ds_config


class DeepSpeedTrainEngine:
    def __init__(self, model: Any, cfg: Any, device: str | None = None):
        import deepspeed
        import torch.distributed as dist

        placed = _device(device)
        if placed is not None and placed.type == "cuda":
            torch.cuda.set_device(placed)  # before NCCL joins: each rank on its own GPU
        init_distributed()
        self.cfg = cfg
        self.tp_size = cfg.tp_size
        self.bf16 = getattr(cfg, "dtype", "fp32") == "bf16"
        # Data-parallel ranks split each mini-batch; the tensor-parallel ranks of one group see the same rows.
        dp_world = dist.get_world_size() // cfg.tp_size
        # Whole shapes, before AutoTP replaces layers with their shards (rl_core.training.zero_state).
        self.full_shapes = {n: p.shape for n, p in model.named_parameters()}
        # ZeRO-0 in float32 without tensor parallelism: the gradients are whole on every rank after the
        # backward's all-reduce, so the engine clips them itself (clip_gradients: one norm, foreach kernels)
        # where DeepSpeed would take the norm again parameter by parameter; sharded or bf16 states are
        # DeepSpeed's to clip.
        self.own_clip = cfg.zero_stage == 0 and not self.bf16 and cfg.tp_size == 1
        ds_config = _ds_config(cfg, dp_world, own_clip=self.own_clip, bf16=self.bf16)
        # bf16: DeepSpeed casts the module to bf16 and its ZeRO optimizer keeps float32 masters (and the Adam
        # moments), made from the bf16 copy: the float32 weights loaded are put back as the masters below.
        masters = {n: p.detach().float().clone() for n, p in model.named_parameters()} if self.bf16 else {}
        if placed is not None:
            model = model.to(placed)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=_adamw(model, cfg), config=ds_config
        )
        if masters:
            from deepspeed.utils import safe_set_full_fp32_param

            for name, p in self.engine.module.named_parameters():
                safe_set_full_fp32_param(p, masters[name].to(p.device))
        self.module = self.engine
        self.device = self.engine.device
        self.dp_group = None
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        if cfg.zero_stage == 0 and self.world_size == 1:
            # One rank: the backward's all-reduce of the gradients (flatten them, a gloo or NCCL call, copy
            # them back) would change nothing.
            self.engine.enable_backward_allreduce = False
        # A parameter the loss did not reach (a LLaVA vision tower's last layer: the features come from the
        # one before) gets a zero gradient, as DeepSpeed's all-reduce gives it at any world size: it still
        # decays and has Adam moments, so one rank and many step alike and its optimizer state is whole.
        self.zero_fill = (
            []
            if self.engine.enable_backward_allreduce
            else [p for p in self.engine.module.parameters() if p.requires_grad and p.numel() > 0]
        )
        if cfg.tp_size > 1:
            from deepspeed.utils import groups

            self.dp_group = groups.get_data_parallel_group()
            self.world_size = dist.get_world_size(group=self.dp_group)
            self.rank = dist.get_rank(group=self.dp_group)

    def train(self, batch: Any) -> dict[str, float]:
        from rl_core.training.ppo import ppo_update

        return ppo_update(self, batch, self.cfg)

    def close(self) -> None:
        """Give back what DeepSpeed holds (its optimizer, gradients, hooks on the module): an engine replaced
        in the same process (a resumed train stage, a benchmark's next arm) otherwise stays in memory."""
        self.engine.destroy()
        del self.engine, self.optimizer, self.module

    def backward_step(self, loss: torch.Tensor, step: bool = True) -> float:
        """Backward ``loss`` into the gradients; with ``step``, the optimizer step on everything accumulated
        since the last one (DeepSpeed's accumulation boundary: its reduction and step happen there) and the
        gradient norm before clipping; without, nan."""
        self.engine.set_gradient_accumulation_boundary(step)
        self.engine.backward(loss)
        if not step:
            return float("nan")
        for p in self.zero_fill:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = None
        if self.own_clip:
            norm = clip_gradients(self.engine.module.parameters(), self.cfg.grad_clip)
        elif self.cfg.zero_stage == 0:  # ZeRO-0 (bf16 or AutoTP) does not report the norm it clips with
            grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        self.engine.step()
        if norm is None:
            norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights as the trainer holds them: the float32 masters in bf16 mode (collective when
        launched), the module's own otherwise."""
        if self.bf16:
            return self._masters()
        if self.cfg.zero_stage == 3:
            import deepspeed

            params = list(self.engine.module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().cpu().clone() for k, v in self.engine.module.state_dict().items()}
        return {k: v.detach().cpu().clone() for k, v in self.engine.module.state_dict().items()}

    def _masters(self) -> dict[str, torch.Tensor]:
        """The state dict with every parameter as its float32 master (gathered from the ZeRO partitions)."""
        from deepspeed.utils import safe_get_full_fp32_param

        module = self.engine.module
        params = dict(module.named_parameters(remove_duplicate=False))
        out = {}
        for k, v in module.state_dict().items():
            full = safe_get_full_fp32_param(params[k]) if k in params else v
            out[k] = full.detach().cpu().clone()
        return out

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        """The whole weights on rank 0 (None elsewhere), gathered from ZeRO-3 partitions or AutoTP shards
        layer by layer. Collective."""
        import torch.distributed as dist

        if self.bf16:
            sd = self._masters()  # every rank takes part in the gathers
            return sd if dist.get_rank() == 0 else None
        if self.cfg.zero_stage == 3 or self.tp_size > 1:
            sd = self.engine._consolidated_16bit_state_dict()
            return None if sd is None else {k: v.detach().cpu().clone() for k, v in sd.items()}
        return self.weights() if dist.get_rank() == 0 else None

    def optimizer_state(self) -> bytes:
        """The world-size-free form (rl_core.training.zero_state: AdamW's moments per parameter name) as a
        state file that cannot carry code (rl_core.artifacts.safe_state): bytes on rank 0 only (a collective
        when launched). In the flow's process too, so that any train stage reads any other's state, whatever
        its layout."""
        from rl_core.training.zero_state import gather_optimizer_state

        return gather_optimizer_state(self) or b""

    def load_optimizer_state(self, data: bytes, what: str = "optimizer state") -> None:
        self.load_optimizer_tree(safe_state.loads(data, what), what)

    def load_optimizer_tree(self, sd: Any, what: str = "optimizer state") -> None:
        """``load_optimizer_state`` of a state file already read (``safe_state.loads``)."""
        from rl_core.training.zero_state import is_universal, scatter_optimizer_state

        if not isinstance(sd, dict) or not is_universal(sd):
            raise ValueError(f"{what}: not the optimizer state of a DeepSpeed train stage")
        scatter_optimizer_state(self, sd)


class TorchTrainEngine:
    """Reference implementation: plain AdamW on one process."""

    def __init__(self, model: Any, cfg: Any):
        self.cfg = cfg
        self.world_size, self.rank = 1, 0
        self.module = model
        self.device = next(model.parameters()).device
        self.optimizer = _adamw(model, cfg)
        self.accumulating = False  # gradients of earlier micro-batches wait for the step

    def train(self, batch: Any) -> dict[str, float]:
        from rl_core.training.ppo import ppo_update

        return ppo_update(self, batch, self.cfg)

    def close(self) -> None:
        del self.optimizer, self.module

    def backward_step(self, loss: torch.Tensor, step: bool = True) -> float:
        if not self.accumulating:
            self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.accumulating = not step
        if not step:
            return float("nan")
        norm = clip_gradients(self.module.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return norm

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}

    def optimizer_state(self) -> bytes:
        return safe_state.dumps(self.optimizer.state_dict())

    def load_optimizer_state(self, data: bytes, what: str = "optimizer state") -> None:
        self.load_optimizer_tree(safe_state.loads(data, what), what)

    def load_optimizer_tree(self, sd: Any, what: str = "optimizer state") -> None:
        self.optimizer.load_state_dict(sd)


def without_dropout(model: Any) -> Any:
    """``model`` with every dropout off (``nn.Dropout`` modules, and the rates attention layers keep as
    numbers: ``attention_dropout``), in place. RL trains with it off, as TRL and OpenRLHF do: with it on, the
    trainer's logprobs of the very tokens the policy sampled are noise (a GPT-2 folder's 0.1 dropout: the
    on-policy ratio is not 1 before any step), and they disagree with the engine's, which has none.

    >>> import torch
    >>> m = without_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
    >>> m[1].p
    0.0
    """
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)
    return model


def make_train_engine(
    backend: str, model: Any, cfg: Any, device: str | None = None
) -> DeepSpeedTrainEngine | TorchTrainEngine:
    """The train engine on ``device`` (rl_core.models.placement's trainer device; None: this rank's GPU if
    any). Its model trains without dropout (``without_dropout``)."""
    without_dropout(model).train()
    if backend == "deepspeed":
        return DeepSpeedTrainEngine(model, cfg, device)
    if backend == "torch":
        placed = _device(device)
        return TorchTrainEngine(model if placed is None else model.to(placed), cfg)
    raise ValueError(f"unknown train backend {backend!r}; choose deepspeed or torch")
