"""The turns after the first of a multi-turn episode, and the batch's prompts as the engine is given them
(images where the environment shows them).

    given, shown = prompts_for(ctx, folder, tok, given, tasks, max_turns)   # ids, images, unexpanded ids
    more_turns(episodes, engine, tok, shown, seeds, spec, limit, max_turns, templated)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envs.base import Multimodal
from rl_core.artifacts.seeding import derive_seed
from rl_core.generation.outcomes import final_of
from rl_core.generation.rollout import Request, SamplingSpec
from rl_core.models.model import defused, observation_text, uses_chat_template
from rl_core.models.model import prompt_ids as tokenize_prompt
from rl_core.models.vision import (
    MAX_IMAGES,
    encode,
    expanded_ids,
    expands_in_processor,
    image_content,
    image_marker,
    image_prefix,
    with_image_marker,
)

if TYPE_CHECKING:
    from rl_core.generation.episodes import Episode


@dataclass
class Prompts:
    """The batch's prompts as the engine is given them: token ids (images expanded), the prompt's images,
    the unexpanded ids where the folder's processor expands images (else empty), and the policy folder."""

    ids: list[list[int]]
    images: list[tuple[bytes, ...]]
    unexpanded: list[tuple[int, ...]]
    folder: Any


def more_turns(
    episodes: list[Episode],
    engine: Any,
    tok: Any,
    prompts: Prompts,
    seeds: list[int],
    spec: SamplingSpec,
    limit: int,
    max_turns: int,
    templated: list[bool],
) -> None:
    """Alternate environment and engine until every episode is done, truncated by ``max_turns`` or by the
    model's context (no room for the next observation and another turn). Where the prompt went through the
    chat template (``templated``), each observation goes in as the template's next user turn
    (``rl_core.models.model.observation_text``); else as its plain text. An observation's images go in
    before its text, one marker each, expanded by the folder's processor (``rl_core.models.vision.encode``);
    every later turn's request carries all the episode's images so far. An action is the turn's text with
    its special tokens (``ans(41<|pad|>3)`` is not ``ans(413)``)."""
    prompt_ids = prompts.ids
    for turn in range(1, max_turns + 1):
        active = []
        for ep in episodes:
            if ep.done:
                continue
            # the turn's text as every engine gives it (sampling.completion_text: special tokens kept, the
            # stop token left out): the environment acts on what the model generated, as a turn is scored
            action = ep.last.text
            res = ep.env.step(action)
            ep.actions.append(action)
            ep.final = final_of(res)
            if res.done or turn == max_turns:
                ep.done = True
                continue
            shown = tuple(res.images)
            obs, raw = _observation(ep, res.observation or "", shown, tok, prompts.folder, templated)
            room = limit - len(prompt_ids[ep.prompt_index]) - len(ep.ids) - len(obs)
            if room < 2:
                ep.done = True
                continue
            ep.observations.append(res.observation or "")
            ep.shown.append(shown)
            ep.add(obs, [0.0] * len(obs), trained=False, raw=raw)
            active.append((ep, room))
        if not active:
            break
        reqs = [_request(ep, prompts, seeds, turn) for ep, _ in active]
        budget = min(spec.max_tokens, min(r for _, r in active) - 1)
        outs = engine.generate(
            reqs, SamplingSpec(n=1, temperature=spec.temperature, top_p=spec.top_p, max_tokens=budget)
        )
        for (ep, _), comps in zip(active, outs, strict=True):
            ep.add(comps[0].token_ids, comps[0].logprobs, trained=True)
            ep.last, ep.turns = comps[0], ep.turns + 1


def _observation(
    ep: Episode, said: str, shown: tuple[bytes, ...], tok: Any, folder: Any, templated: list[bool]
) -> tuple[list[int], list[int]]:
    """An observation's token ids as the model sees them (its images expanded by the folder's processor) and
    unexpanded (what vLLM is given): its images' markers before its text, as the chat template's next user
    turn where the prompt went through the template."""
    if shown and not expands_in_processor(folder):
        raise ValueError(
            "an observation shows images: the policy's processor must expand them (Idefics3, SmolVLM, "
            "Qwen-VL); this policy is not one"
        )
    said = defused(tok, said)
    text = image_marker(folder) * len(shown) + said
    if templated[ep.prompt_index]:  # the images as parts of the turn, as vision-language templates take them
        last = ep.last.token_ids
        stopped = ep.last.finish_reason == "stop" and bool(last)
        ended = tok.convert_ids_to_tokens(last[-1]) if stopped else None
        text = observation_text(tok, image_content(len(shown), said) if shown else said, ended)
    raw = tok(text, add_special_tokens=False)["input_ids"]
    return (encode(folder, text, shown, add_special_tokens=False)[0] if shown else raw), raw


def prompts_for(
    ctx: Any, folder: Any, tok: Any, given: list[Any], tasks: list[dict[str, Any]], max_turns: int
) -> tuple[list[Any], Prompts]:
    """The prompts (as the environment gave them, with an image marker where the folder's processor expands
    the task's image) and the ``Prompts`` the engine is given: LLaVA's fixed placeholder prefix, or one
    processor call per prompt (Idefics3, SmolVLM)."""
    chat = ctx.cfg.model.chat_template
    ids = [tokenize_prompt(tok, p, chat) for p in given]
    images: list[tuple[bytes, ...]] = [() for _ in tasks]
    unexpanded: list[tuple[int, ...]] = [() for _ in tasks]
    if isinstance(ctx.env, Multimodal):
        if max_turns > 1 and not expands_in_processor(folder):
            raise ValueError(
                f"environment {ctx.env.name!r}: multi-turn episodes with images need a policy whose "
                "processor expands them (Idefics3, SmolVLM, Qwen-VL); LLaVA's fixed image prefix holds one "
                "image"
            )
        images = [(ctx.env.image(t),) for t in tasks]
        if expands_in_processor(folder):  # the processor expands the marker: one call per prompt
            mark = image_marker(folder)
            given = [with_image_marker(p, uses_chat_template(tok, p, chat), mark) for p in given]
            unexpanded = [tuple(tokenize_prompt(tok, p, chat)) for p in given]
            ids = [expanded_ids(folder, tok, p, ims, chat) for p, ims in zip(given, images, strict=True)]
        else:
            ids = [image_prefix(folder) + i for i in ids]
    return given, Prompts(ids, images, unexpanded, folder)


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The seed of an episode's request at ``turn`` (1, 2, ...; its first request has the episode's seed)."""
    return derive_seed(seed, sample, "turn", turn)


def _request(ep: Episode, prompts: Prompts, seeds: list[int], turn: int) -> Request:
    """The episode's next turn's request: its whole sequence so far and every image it showed; with images,
    the unexpanded sequence for vLLM (a prompt without images is its own)."""
    i = ep.prompt_index
    images = prompts.images[i] + ep.images()
    if len(images) > MAX_IMAGES:
        raise ValueError(
            f"episode {i}/{ep.sample_index}: {len(images)} images by turn {turn + 1}, more than one request "
            f"carries (rl_core.models.vision.MAX_IMAGES={MAX_IMAGES})"
        )
    raw = tuple(prompts.unexpanded[i] or prompts.ids[i]) + tuple(ep.raw) if images else ()
    seed = turn_seed(seeds[i], ep.sample_index, turn)
    return Request(prompts.ids[i] + ep.ids, seed, images, raw)


class Scripted:
    """An engine that answers each episode with its teacher's next action (``envs.base.Teacher``), as tokens
    of the policy's tokenizer closed by its EOS: driven through the generation's own turns, a teacher's
    episode is the token stream an RL episode with those actions is (prompt, images, observations alike).
    ``scripts``: each task's actions, in the tasks' order, whose episodes are seeded ``0, 1, ...`` (one
    sample each): a request's seed says whose turn it is and which (the first's is the episode's seed, a later
    one's ``_request`` derives), so two tasks with the same prompt and pictures of the same size keep their
    own scripts. Out of actions, an empty turn (the episode goes on to ``max_turns``)."""

    def __init__(self, tok: Any, scripts: list[list[str]], max_turns: int):
        from rl_core.generation.rollout import Completion

        self.completion, self.tok, self.scripts = Completion, tok, [list(a) for a in scripts]
        self.whose = {i: (i, 0) for i in range(len(scripts))}
        for i in range(len(scripts)):
            for turn in range(1, max_turns + 1):
                seed = turn_seed(i, 0, turn)
                if seed in self.whose:
                    raise ValueError(f"Scripted: turn seeds collide ({seed})")
                self.whose[seed] = (i, turn)

    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Any]]:
        out = []
        for r in requests:
            if r.seed not in self.whose:
                raise ValueError(f"Scripted: a request of no scripted episode (seed {r.seed})")
            i, turn = self.whose[r.seed]
            action = self.scripts[i][turn] if turn < len(self.scripts[i]) else ""
            ids = self.tok(action, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append([self.completion(ids, [0.0] * len(ids), action, "stop")] * spec.n)
        return out

    def stats(self) -> dict[str, float]:
        return {}
