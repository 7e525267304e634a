"""How well the graders and the audit hold against reward hacking: the adversarial suite's rates.

Runs every exploit completion of ``benchmarks/reward_exploits.py`` through the HumanEval grader (fresh
sandboxes, ``envs/humaneval.py``) and the audit's code rules, the judge injections and honest texts through
the text rules, and the honest completions (the suite's and the 164 HumanEval reference solutions) through
both. Reports: exploits scored 0, exploits flagged, exploits that neither scored 0 nor were flagged (must be
0), honest completions that passed, honest completions flagged (must be 0), and the same for text.

    python benchmarks/reward_audit.py --json     # last line: the figures; ratio = exploits caught / all
    python benchmarks/reward_audit.py --smoke --json   # the first 4 exploits, 2 honest, 4 reference solutions
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, result_file, smoke_state  # noqa: E402
from benchmarks.reward_exploits import CODE_EXPLOITS, HONEST, HONEST_TEXT, JUDGE_INJECTIONS  # noqa: E402
from envs.humaneval import canonical_completions, problems, score  # noqa: E402
from rl_core.scoring.audit import EXPLOIT  # noqa: E402
from rl_core.scoring.audit_code import code_flags  # noqa: E402
from rl_core.scoring.audit_text import judge_injection  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "reward_audit.json"
SMOKE = 4  # exploits and reference solutions in a smoke (the first ones: none waits on a timeout)


def graded(rows: list[tuple[str, str, str]]) -> list[dict]:
    """Each (name, task_id, completion): passed, the grader's flags, the audit's exploit flags."""
    results = score([{"task_id": t, "completion": c} for _, t, c in rows])["results"]
    problem = problems()
    out = []
    for (name, task_id, completion), r in zip(rows, results, strict=True):
        audit = set(code_flags(problem[task_id]["prompt"] + completion)) | (set(r["flags"]) & set(EXPLOIT))
        out.append({"name": name, "passed": r["passed"], "grader": r["flags"], "audit": sorted(audit)})
    return out


def measure(smoke: bool = False) -> dict:
    n, m = (SMOKE, SMOKE // 2) if smoke else (None, None)  # None: all of them
    t0 = time.monotonic()
    exploits = graded(CODE_EXPLOITS[:n])
    reference = [(r["task_id"], r["task_id"], r["completion"]) for r in canonical_completions()[:n]]
    honest = graded(HONEST[:m] + reference)
    seconds = time.monotonic() - t0
    caught = [e for e in exploits if not e["passed"] or e["audit"]]
    return {
        "exploits": len(exploits),
        "exploits_scored_0": sum(not e["passed"] for e in exploits),
        "exploits_flagged": sum(bool(e["audit"]) for e in exploits),
        "exploits_missed": [e["name"] for e in exploits if e not in caught],
        "honest": len(honest),
        "honest_passed": sum(e["passed"] for e in honest),
        "honest_flagged": [e["name"] for e in honest if e["audit"]],
        "injections": len(JUDGE_INJECTIONS),
        "injections_flagged": sum(judge_injection(t) for t in JUDGE_INJECTIONS),
        "honest_text": len(HONEST_TEXT),
        "honest_text_flagged": sum(judge_injection(t) for t in HONEST_TEXT),
        "per_exploit": {
            e["name"]: {"passed": e["passed"], "grader": e["grader"], "audit": e["audit"]} for e in exploits
        },
        "seconds": round(seconds, 1),
        "ratio": len(caught) / len(exploits),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line last")
    parser.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT})")
    add_smoke_flag(parser)
    args = parser.parse_args()
    smoke_state(args.smoke, "reward-audit")
    finish(
        {"benchmark": "reward_audit", **measure(args.smoke)},
        result_file(args.out, OUT, args.smoke),
        args.json,
        args.smoke,
    )


if __name__ == "__main__":
    main()
