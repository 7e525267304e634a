"""Computer use from pixels on MiniWoB++ (``task.env: miniwob``): the policy sees the task's page as a
160x210 screenshot with its instruction, and acts one action a turn in the screenshot's own pixels.

    task.env: miniwob
    task.env_args: {tasks: [click-button, click-link, enter-text], max_turns: 4}

- **Actions** (one per turn): ``click(x,y)``, ``type("text")``, ``key(Enter)``. A malformed action, or a click
  off the screenshot, is answered with an error observation (the same screenshot) and the episode goes on.
- **Observations**: after an action that does not end the episode, the new screenshot (``StepResult.images``);
  the episode ends when the page says so (its reward: correct when positive) or at ``max_turns``.
- **Hermetic**: a task is a page and its seed (``Math.seedrandom``): the page, the instruction and every
  screenshot are a function of the task and the actions so far. Each step restores the state from scratch
  (the page restarted on its seed, the episode's earlier actions replayed) in a browser borrowed from this
  process's pool, so any number of interleaved episodes share a few browsers, a replayed stage (and the
  execute_envs stage, which replays the stored actions) sees the same pictures, and nothing carries from one
  episode to the next. Held-out tasks are unseen seeds (the split is a hash of the task's page and seed).
- **The browsers**: headless Chromium driven by chromedriver (Debian's ``chromium`` and ``chromium-driver``;
  the Makefile installs both), on the pages inside the ``miniwob`` wheel (file://), with no proxy that
  answers (no network); ``browsers`` per process, started on first use and closed at exit. Without Chromium
  the environment is refused before any work, naming what is missing.
- **The oracle** (``oracle_actions``) reads the page's DOM and answers each task: the warm-up's teacher, and
  the check that every task here can be solved through this action space.

    env = MiniWoBEnv(MiniWoBOptions(tasks=["click-button"]))
    task = env.tasks("train", task_cfg, seed=0)[0]
    env.reset(task, seed=0)              # 'Click on the "no" button.\n'
    env.image(task)                      # PNG, 160x210
    env.step("click(17,62)").outcome     # {'correct': True, ...}
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envs.base import StepResult, draw_tasks
from envs.miniwob_browser import HEIGHT, KEYS, POOL, WIDTH, Browser, browser_paths, pages, using

__all__ = ["HEIGHT", "POOL", "WIDTH", "Browser", "MiniWoBEnv", "browser_paths", "oracle_actions"]

DEFAULT_TASKS = ("click-button", "click-link", "enter-text")
# the pages the oracle answers (the warm-up's teacher; configs/miniwob.yaml names the curve's)
ORACLE_TASKS = (*DEFAULT_TASKS, "click-test", "focus-text", "click-color", "click-collapsible-nodelay")
# No Tab: focus moves only where the policy points. With it, fixed keys solved two of the curve's pages
# unseen (focus-text: Tab, Tab; click-test: a click on nothing, Tab, Enter): a reward that needs no pixels.
# not text: controls, format characters, private use (WebDriver's keys), surrogates, unassigned, line breaks
_NOT_TEXT = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}
_ACTION = re.compile(
    r'^\s*(?:click\(\s*(?P<x>-?\d{1,6})\s*,\s*(?P<y>-?\d{1,6})\s*\)|type\("(?P<text>[^"\n]{0,64})"\)'
    rf"|key\((?P<key>{'|'.join(KEYS)})\))\s*$"
)


class MiniWoBOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TASKS), min_length=1, description="MiniWoB++ task pages."
    )
    max_turns: int = Field(4, ge=1, le=8, description="Actions per episode at most.")
    browsers: int = Field(
        3,
        ge=1,
        le=16,
        description="Headless browsers per process, shared by its episodes (one per page keeps "
        "each on its page).",
    )

    @field_validator("tasks")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        missing = [n for n in names if not (pages() / f"{n}.html").exists()]
        if missing:
            raise ValueError(f"no MiniWoB++ page {', '.join(missing)} (the miniwob wheel's html/miniwob)")
        return names


def parse_action(text: str) -> tuple[str, Any] | str:
    """``("click", (x, y))``, ``("type", text)`` or ``("key", name)``; else what is wrong with it.

    >>> parse_action("click(12, 40)"), parse_action('type("Ana")'), parse_action("key(Enter)")
    (('click', (12, 40)), ('type', 'Ana'), ('key', 'Enter'))
    >>> parse_action("click(170,5)"), parse_action("jump")[:13]
    ('click(170,5) is off the 160x210 screen', 'not an action')

    Typed text is text: a control character, or one of the codes WebDriver reads as a key (Tab, the arrows,
    F5: Unicode's private use area), is refused, so that ``type`` presses no key that ``key`` does not offer.

    >>> print(parse_action('type("a\\ue004b")'))
    type(...) has an unprintable character at 2: '\\ue004' (text only; keys: key(Enter), ...)
    """
    m = _ACTION.match(text)
    if m is None:
        return f'not an action: {text.strip()[:40]!r} (click(x,y), type("text"), key(Enter))'
    if m["x"] is not None:
        x, y = int(m["x"]), int(m["y"])
        if not (0 <= x < WIDTH and 0 <= y < HEIGHT):
            return f"click({x},{y}) is off the {WIDTH}x{HEIGHT} screen"
        return ("click", (x, y))
    if m["text"] is not None:
        bad = next((i for i, c in enumerate(m["text"]) if unicodedata.category(c) in _NOT_TEXT), None)
        if bad is not None:
            return (
                f"type(...) has an unprintable character at {bad + 1}: {m['text'][bad]!r} "
                "(text only; keys: key(Enter), ...)"
            )
        return ("type", m["text"])
    return ("key", m["key"])


class MiniWoBEnv:
    """MiniWoB++ pages as a multi-turn, multimodal environment (see the module's text)."""

    name = "miniwob"
    config_model: type[BaseModel] = MiniWoBOptions
    image_size = HEIGHT
    policy_family = "idefics3"  # the built-in policy: a screenshot in every turn, expanded by its processor

    def __init__(self, options: BaseModel | None = None) -> None:
        self.options = options if isinstance(options, MiniWoBOptions) else MiniWoBOptions()
        self.max_turns = self.options.max_turns
        self._task: dict[str, Any] | None = None
        self._actions: list[tuple[str, Any]] = []
        self._invalid = 0
        browser_paths()  # refused before any work without a browser

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        names = self.options.tasks

        def draw(rng: Any) -> dict[str, Any]:
            name, page_seed = rng.choice(names), rng.randrange(2**31)
            return {
                "prompt": name,
                "answer": "",
                "op": name,
                "page": name,
                "page_seed": page_seed,
                "key": f"{name}:{page_seed}",
            }

        return draw_tasks("miniwob", split, task_cfg, seed, draw)

    def _replay(self, b: Browser) -> None:
        assert self._task is not None
        b.start(self._task["page"], int(self._task["page_seed"]))
        for action in self._actions:
            b.act(action)

    def reset(self, task: dict[str, Any], seed: int) -> str:
        self._task, self._actions, self._invalid = task, [], 0
        return _first(task["page"], int(task["page_seed"]), self.options.browsers)[0] + "\n"

    def image(self, task: dict[str, Any]) -> bytes:
        """The page at the start of the task's episode."""
        return _first(task["page"], int(task["page_seed"]), self.options.browsers)[1]

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        parsed = parse_action(action)
        if isinstance(parsed, str):  # the episode goes on, on the same screen
            self._invalid += 1
        else:
            self._actions.append(parsed)

        def replayed(b: Browser) -> tuple[bool, float, bytes | None]:
            self._replay(b)
            done, reward = b.result()
            return done, reward, None if done and not isinstance(parsed, str) else b.screenshot()

        done, reward, shot = using(self.options.browsers, self._task["page"], replayed)
        if isinstance(parsed, str):
            return StepResult(f"error: {parsed}\n", False, self._outcome(0.0), images=(shot,))
        if not done:  # the outcome so far (an episode cut off at max_turns ends on it: not solved)
            return StepResult("", False, self._outcome(0.0), images=(shot,))
        return StepResult(observation=None, done=True, outcome=self._outcome(reward))

    def teacher_actions(self, task: dict[str, Any], flawed: bool) -> list[str]:
        """The oracle's actions (``oracle_actions``). A flawed teacher makes one mistake: it types the text
        without its last letter where the oracle types, else its first click lands 40 pixels right of and 40
        below its target (on another element, or on nothing, but on a large enough target still in it)."""
        actions = oracle_actions(self, task)
        if not flawed:
            return actions
        typed = [i for i, a in enumerate(actions) if a.startswith("type(")]
        if typed:
            text = parse_action(actions[typed[0]])[1]
            actions[typed[0]] = f'type("{text[:-1]}")'
        else:
            x, y = parse_action(actions[0])[1]  # the oracle's first action is then a click
            actions[0] = f"click({(x + 40) % WIDTH},{(y + 40) % HEIGHT})"
        return actions

    def _outcome(self, reward: float) -> dict[str, Any]:
        return {
            "correct": reward > 0,
            "well_formed": self._invalid == 0,
            "raw_reward": reward,
            "invalid_actions": self._invalid,
        }


@functools.lru_cache(maxsize=4096)
def _first(page: str, seed: int, browsers: int) -> tuple[str, bytes]:
    """The instruction and first screenshot of a task's episode: one page start for both (a function of the
    page and its seed; the preflight and every stage ask for them, each task several times)."""

    def shown(b: Browser) -> tuple[str, bytes]:
        b.start(page, seed)
        return b.instruction(), b.screenshot()

    return using(browsers, page, shown)


_CENTER = "var r = arguments[0].getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2];"


def oracle_actions(env: MiniWoBEnv, task: dict[str, Any]) -> list[str]:
    """The actions that solve ``task``, read from its page's DOM (the warm-up's teacher)."""
    name = task["page"]
    if name not in ORACLE_TASKS:
        raise ValueError(f"no oracle for MiniWoB++ task {name}; it has {', '.join(ORACLE_TASKS)}")
    return using(env.options.browsers, name, lambda b: _solve(b, name, int(task["page_seed"])))


def _solve(b: Browser, name: str, seed: int) -> list[str]:
    b.start(name, seed)
    said = b.instruction()
    quoted = re.search(r'"([^"]*)"', said)
    target = quoted.group(1) if quoted else ""

    def centre(selector: str, text: str | None = None) -> str:
        els = b.driver.find_elements("css selector", selector)
        el = next(e for e in els if text is None or e.text.strip() == text)
        x, y = b.driver.execute_script(_CENTER, el)
        return f"click({int(x)},{int(y)})"

    if name == "click-button":
        return [centre("#area button", target)]
    if name == "click-link":
        return [centre("#area .alink", target)]
    if name == "click-test":
        return [centre("#subbtn")]
    if name == "focus-text":
        return [centre("#tt")]
    if name == "click-collapsible-nodelay":  # open the section, then Submit where it moved to
        first = centre("#area h3")
        b.act(("click", tuple(int(v) for v in re.findall(r"\d+", first))))
        return [first, centre("#subbtn")]
    if name == "click-color":  # the instruction names the colour (shown as a swatch or a word)
        colour = re.search(r"the (\S+) colored box", said)
        return [centre(f'#area .color[data-color="{colour.group(1) if colour else ""}"]')]
    return [centre("#tt"), f'type("{target}")', centre("#subbtn")]
