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

import atexit
import contextlib
import functools
import io
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envs.base import EnvUnavailable, StepResult, draw_tasks

WIDTH, HEIGHT = 160, 210  # MiniWoB's task area: the screenshot's size and the click coordinates' range
DEFAULT_TASKS = ("click-button", "click-link", "enter-text")
# the pages the oracle answers (the warm-up's teacher; configs/miniwob.yaml names the curve's)
ORACLE_TASKS = (*DEFAULT_TASKS, "click-test", "focus-text", "click-color", "click-collapsible-nodelay")
_ACTION = re.compile(
    r'^\s*(?:click\(\s*(?P<x>-?\d+)\s*,\s*(?P<y>-?\d+)\s*\)|type\("(?P<text>[^"\n]{0,64})"\)'
    r"|key\((?P<key>Enter|Tab|Backspace|Escape|Space)\))\s*$"
)
_KEYS = {"Enter": "\ue007", "Tab": "\ue004", "Backspace": "\ue003", "Escape": "\ue00c", "Space": " "}


def pages() -> Path:
    import miniwob

    return Path(miniwob.__file__).parent / "html" / "miniwob"


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
        return ("type", m["text"])
    return ("key", m["key"])


def browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver (``MINIWOB_CHROME_BINARY``/``MINIWOB_CHROMEDRIVER``, else on the PATH); an
    error naming what is missing."""
    chrome = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium")
    chrome = chrome or shutil.which("chromium-browser")
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver")
    missing = [n for n, p in (("chromium", chrome), ("chromedriver", driver)) if not p]
    if missing:
        raise EnvUnavailable(
            f"task.env=miniwob needs a headless Chromium and its driver; not found: {', '.join(missing)} "
            "(Debian: apt-get install chromium chromium-driver; `make` installs them)"
        )
    return str(chrome), str(driver)


class Browser:
    """One headless Chromium on MiniWoB's pages."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        chrome, driver = browser_paths()
        # Chromium's profile and the temporary folders it makes beside it (its singleton socket's, which it
        # leaves in the temp folder even after a clean quit) in one folder of this browser's, removed at close
        # (in /tmp when the temp folder's path is long: a socket's path may have 107 bytes at most, and
        # Chromium exits at start, saying nothing why, when its has more)
        base = tempfile.gettempdir()
        self.scratch = tempfile.mkdtemp(prefix="rlfoundry-browser-", dir=base if len(base) <= 34 else "/tmp")
        opts = webdriver.ChromeOptions()
        opts.binary_location = chrome
        for arg in (
            f"--user-data-dir={self.scratch}/profile",
            "--headless=new",
            "--no-sandbox",  # the pages are the wheel's own; Chromium's sandbox needs user namespaces
            "--disable-gpu",
            *("--disable-dev-shm-usage", "--window-size=400,600"),
            "--force-device-scale-factor=1",
            "--proxy-server=127.0.0.1:9",  # no network: nothing answers there
            "--hide-scrollbars",
            "--disable-partial-raster",  # else rounded corners differ by what the browser drew before
        ):
            opts.add_argument(arg)
        service = Service(driver, env={**os.environ, "TMPDIR": self.scratch})
        try:
            self.driver = webdriver.Chrome(service=service, options=opts)
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self.page = ""

    def start(self, name: str, seed: int) -> None:
        """The page ``name`` at the start of the episode of ``seed``."""
        if self.page != name:
            self.driver.get((pages() / f"{name}.html").as_uri())
            # no blinking caret: a screenshot must not depend on when it was taken
            self.driver.execute_script(
                "var s = document.createElement('style'); s.textContent = '* { caret-color: transparent "
                "!important; }'; document.head.appendChild(s);"
            )
            self.page = name
        run = self.driver.execute_script
        run("core.endEpisode(0);")
        run(f"Math.seedrandom({seed});")
        run('core.setDataMode("train");')
        run("core.startEpisodeReal();")
        # nothing focused: a page's element that outlives its episodes (enter-text's field) would keep the
        # last episode's focus and its focus ring, and the screenshots would depend on what ran before
        run("if (document.activeElement) { document.activeElement.blur(); }")
        for _ in range(50):
            if run("return WOB_TASK_READY;"):
                return
            time.sleep(0.02)
        raise RuntimeError(f"MiniWoB++ page {name} did not get ready")

    def act(self, action: tuple[str, Any]) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        chain = ActionChains(self.driver, duration=0)
        kind, arg = action
        if kind == "click":
            chain.w3c_actions.pointer_action.move_to_location(*arg)
            chain.w3c_actions.pointer_action.click()
        elif kind == "type":
            chain.send_keys(arg)
        else:
            chain.send_keys(_KEYS[arg])
        chain.perform()

    def instruction(self) -> str:
        got = self.driver.execute_script("return core.getUtterance();")
        return str(got["utterance"] if isinstance(got, dict) else got)

    def result(self) -> tuple[bool, float]:
        done, reward = self.driver.execute_script("return [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL];")
        return bool(done), float(reward or 0.0)

    def screenshot(self) -> bytes:
        from PIL import Image

        img = Image.open(io.BytesIO(self.driver.get_screenshot_as_png())).convert("RGB")
        buf = io.BytesIO()
        img.crop((0, 0, WIDTH, HEIGHT)).save(buf, format="PNG", optimize=False)
        return buf.getvalue()

    def dom(self, script: str) -> Any:
        return self.driver.execute_script(script)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.driver.quit()
        shutil.rmtree(self.scratch, ignore_errors=True)


class _Pool:
    """This process's browsers: borrowed one at a time, started on first use (``most`` at once), closed at
    exit."""

    def __init__(self) -> None:
        self.idle: list[Browser] = []
        self.every: list[Browser] = []
        self.started = 0
        self.cond = threading.Condition()
        atexit.register(self.close)

    @contextlib.contextmanager
    def borrow(self, most: int, page: str = "") -> Iterator[Browser]:
        """An idle browser, one already on ``page`` first (a page change reloads it: ~0.2 s)."""
        with self.cond:
            while not self.idle and self.started >= most:
                self.cond.wait()
            on_page = [b for b in self.idle if b.page == page]
            if on_page:
                self.idle.remove(b := on_page[0])
            elif self.idle and self.started >= most:
                b = self.idle.pop()
            else:
                b = None
            if b is None:
                self.started += 1
        if b is None:
            try:
                b = Browser()
            except BaseException:
                with self.cond:
                    self.started -= 1
                    self.cond.notify()
                raise
            with self.cond:
                self.every.append(b)
        try:
            yield b
        finally:
            with self.cond:
                self.idle.append(b)
                self.cond.notify()

    def close(self) -> None:
        with self.cond:
            for b in self.every:
                b.close()
            self.every, self.idle, self.started = [], [], 0


POOL = _Pool()


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
        with POOL.borrow(self.options.browsers, self._task["page"]) as b:
            if isinstance(parsed, str):  # the episode goes on, on the same screen
                self._invalid += 1
                self._replay(b)
                shot = b.screenshot()
                return StepResult(f"error: {parsed}\n", False, self._outcome(0.0), images=(shot,))
            self._actions.append(parsed)
            self._replay(b)
            done, reward = b.result()
            if not done:  # the outcome so far (an episode cut off at max_turns ends on it: not solved)
                return StepResult("", False, self._outcome(0.0), images=(b.screenshot(),))
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
    with POOL.borrow(browsers, page) as b:
        b.start(page, seed)
        return b.instruction(), b.screenshot()


_CENTER = "var r = arguments[0].getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2];"


def oracle_actions(env: MiniWoBEnv, task: dict[str, Any]) -> list[str]:
    """The actions that solve ``task``, read from its page's DOM (the warm-up's teacher)."""
    name = task["page"]
    if name not in ORACLE_TASKS:
        raise ValueError(f"no oracle for MiniWoB++ task {name}; it has {', '.join(ORACLE_TASKS)}")
    with POOL.borrow(env.options.browsers, name) as b:
        b.start(name, int(task["page_seed"]))
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
