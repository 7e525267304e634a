"""The HF engine's sampling step (rl_core.generation.sampling.sample_step) against the row-by-row loop it
replaced: the same tokens and the same logprob bits, greedy and sampled, for every row's own generator."""

from __future__ import annotations

import pytest
import torch

from rl_core.generation.sampling import sample_step


def _row_by_row(logits: torch.Tensor, gens: list[torch.Generator], temperature: float):
    toks, lps = [], []
    for i, g in enumerate(gens):
        if temperature == 0:
            tok = int(logits[i].argmax())
            lp = float(torch.log_softmax(logits[i], -1)[tok])
        else:
            logp = torch.log_softmax(logits[i] / temperature, -1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=g))
            lp = float(logp[tok])
        toks.append(tok)
        lps.append(lp)
    return toks, lps


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("vocab", [37, 4096])
def test_the_batched_step_is_the_row_by_row_loop_bit_for_bit(temperature, vocab):
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    logits[5, :] = 0.0  # a flat row (ties: the first index, as argmax of one row)
    logits[7, 11] = -1e9  # a suppressed token
    for step in range(4):  # the generators advance one draw per row and step, in both
        a = [torch.Generator().manual_seed(1009 * i + step) for i in range(64)]
        b = [torch.Generator().manual_seed(1009 * i + step) for i in range(64)]
        want, got = _row_by_row(logits, a, temperature), sample_step(logits, b, temperature)
        assert got[0] == want[0]
        assert [float.hex(x) for x in got[1]] == [float.hex(x) for x in want[1]]
        assert [g.get_state().tolist() == h.get_state().tolist() for g, h in zip(a, b, strict=True)] == [
            True
        ] * 64


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_logits_are_refused_naming_the_rows(temperature, bad):
    logits = torch.zeros(4, 9)
    logits[2, 3] = bad
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    with pytest.raises(ValueError, match=r"NaN in rows \[2\]"):
        sample_step(logits, gens, temperature)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_step_never_waits_for_the_device(temperature):
    """``sample_tokens`` reads nothing back (no ``bool``, ``item``, ``tolist`` or ``cpu`` of a tensor): on a
    GPU the step's kernels queue behind the forward's, and the NaN check happens on the host afterwards."""
    from rl_core.generation.sampling import sample_tokens

    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    logits[3, 0] = float("nan")
    gens = [torch.Generator().manual_seed(i) for i in range(8)]
    reads: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        for name in ("__bool__", "item", "tolist", "cpu"):
            real = getattr(torch.Tensor, name)
            mp.setattr(
                torch.Tensor, name, lambda t, *a, _n=name, _r=real, **k: reads.append(_n) or _r(t, *a, **k)
            )
        toks, lps = sample_tokens(logits, gens, temperature)
    assert reads == []
    assert toks.shape == lps.shape == (8,)
    assert torch.isnan(lps).tolist() == [i == 3 for i in range(8)]


def test_the_engine_names_a_model_that_gives_nan(tmp_path):
    from rl_core.generation.rollout import HFEngine, Request, SamplingSpec
    from tests.model_folders import write_qwen3_folder

    engine = HFEngine(write_qwen3_folder(tmp_path / "m"))
    with torch.no_grad():
        engine.model.get_output_embeddings().weight[7].fill_(float("nan"))  # token 7's logit: NaN, every row
    with pytest.raises(ValueError, match=r"NaN in rows \[0, 1, 2, 3\] of the batch \(row 0 from step 0\)"):
        engine.generate([Request([5, 6, 2], seed=1), Request([4], seed=2)], SamplingSpec(n=2, max_tokens=4))


def test_the_engine_samples_on_the_models_device_and_copies_back_only_tokens(tmp_path, monkeypatch):
    """The decoding loop keeps each step's logits on the model's device (the CPU here, standing in for a
    GPU): no tensor with the vocabulary as its last dimension is copied with ``.cpu()``, only the tokens and
    their logprobs, once; the completions stop at their first stop token, as the row-by-row loop did."""
    from rl_core.generation.rollout import HFEngine, Request, SamplingSpec
    from tests.model_folders import write_qwen3_folder

    engine = HFEngine(write_qwen3_folder(tmp_path / "m"))
    vocab = engine.model.config.vocab_size
    moved: list[tuple[int, ...]] = []
    real_cpu = torch.Tensor.cpu

    def spy(self, *a, **k):
        moved.append(tuple(self.shape))
        return real_cpu(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", spy)
    reqs = [Request([5, 6, 2, 9], seed=1), Request([7, 3], seed=2)]
    out = engine.generate(reqs, SamplingSpec(n=4, temperature=1.0, max_tokens=16))
    assert moved and all(shape[-1] != vocab for shape in moved), moved
    assert len(moved) == 2  # the tokens and the logprobs, [rows, steps] each
    for c in (c for cs in out for c in cs):
        assert len(c.token_ids) == len(c.logprobs) <= 16
        stops = [t for t in c.token_ids if t in engine.eos]
        assert stops == ([c.token_ids[-1]] if c.finish_reason == "stop" else [])


def test_the_head_runs_on_the_last_position_only_and_the_draws_are_unchanged(tmp_path, monkeypatch):
    """Each step asks the model for its last position's logits only (``logits_to_keep=1``, as transformers'
    generate does): the prompt's step no longer computes batch x prompt x vocabulary logits it throws away.
    The completions and their logprob bits are those of the whole-logits forward."""
    from rl_core.generation.rollout import HFEngine, Request, SamplingSpec
    from tests.model_folders import write_qwen3_folder

    engine = HFEngine(write_qwen3_folder(tmp_path / "m"))
    assert engine.last_only == {"logits_to_keep": 1}
    widths: list[int] = []
    forward = type(engine.model).forward

    def spy(self, *a, **k):
        out = forward(self, *a, **k)
        widths.append(out.logits.shape[1])
        return out

    monkeypatch.setattr(type(engine.model), "forward", spy)
    reqs = [Request([5, 6, 2, 9, 4, 4, 8], seed=1), Request([7, 3], seed=2)]
    got = {}
    for keep in ({"logits_to_keep": 1}, {}):
        engine.last_only = keep
        widths.clear()
        for t in (1.0, 0.0):
            out = engine.generate(reqs, SamplingSpec(n=3, temperature=t, max_tokens=12))
            got[(bool(keep), t)] = [(c.token_ids, c.logprobs) for cs in out for c in cs]
        assert widths[0] == (1 if keep else 7)  # the prompt's step: the padded prompt is 7 wide
    assert got[(True, 1.0)] == got[(False, 1.0)]
    assert got[(True, 0.0)] == got[(False, 0.0)]
