"""The headless browsers of the MiniWoB++ environment (``envs.miniwob``): Chromium driven by chromedriver on
the pages inside the ``miniwob`` wheel, a pool of them per process, and what makes an episode's pictures and
reward a function of its page, seed and actions whatever the browser ran before.

- **An episode's start** restarts the page on its seed, blurs what the last episode focused, and resets where
  keyboard focus would move from. The page is always focused (Chromium's focus emulation): headless, a page
  loses focus to nothing in particular, and whether a click then focuses a field (``focus-text`` pays on that
  field's focus event) depended on what ran before.
- **A browser that fails** (Chromium killed by the OOM killer, a hung renderer past the timeouts, a lost
  chromedriver) is closed and taken out of the pool; ``using`` retries the work once on a fresh one, and a
  second failure is an error naming the page (a wedged browser is never handed to the next episode).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from envs.base import EnvUnavailable

WIDTH, HEIGHT = 160, 210  # MiniWoB's task area: the screenshot's size and the click coordinates' range
KEYS = {"Enter": "\ue007", "Backspace": "\ue003", "Escape": "\ue00c", "Space": " "}  # WebDriver's key codes
PAGE_TIMEOUT_S = 20  # a page load or a script past this fails the browser (``BrowserFailed``)
COMMAND_TIMEOUT_S = 30  # chromedriver's answer to one command
T = TypeVar("T")


class BrowserFailed(RuntimeError):
    """The browser, not the page: it crashed, hung or lost its driver."""


def pages() -> Path:
    import miniwob

    return Path(miniwob.__file__).parent / "html" / "miniwob"


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


def _failures() -> tuple[type[BaseException], ...]:
    """What a browser that crashed or hung raises: WebDriver's errors, the HTTP client's, the socket's."""
    from selenium.common.exceptions import WebDriverException
    from urllib3.exceptions import HTTPError

    return (WebDriverException, HTTPError, OSError)


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
            self.driver.command_executor.client_config.timeout = COMMAND_TIMEOUT_S
            self.driver.set_page_load_timeout(PAGE_TIMEOUT_S)
            self.driver.set_script_timeout(PAGE_TIMEOUT_S)
            self.driver.execute_cdp_cmd("Emulation.setFocusEmulationEnabled", {"enabled": True})
        except BaseException:
            self.close()
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
        # last episode's focus and its focus ring, and the screenshots would depend on what ran before; and
        # the point keyboard focus moves on from back at the page's top (focusing an element there, then
        # removing it), not where the last episode left it
        run(
            "if (document.activeElement) { document.activeElement.blur(); }"
            "var e = document.createElement('span'); e.tabIndex = -1;"
            "document.body.insertBefore(e, document.body.firstChild); e.focus(); e.blur(); e.remove();"
        )
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
            chain.send_keys(KEYS[arg])
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
    exit; one that fails while borrowed is closed and dropped."""

    def __init__(self) -> None:
        self.idle: list[Browser] = []
        self.every: list[Browser] = []
        self.started = 0
        self.cond = threading.Condition()
        atexit.register(self.close)

    @contextlib.contextmanager
    def borrow(self, most: int, page: str = "") -> Iterator[Browser]:
        """An idle browser, one already on ``page`` first (a page change reloads it: ~0.2 s). One whose use
        raised a browser's failure (``_failures``) is closed and dropped, not handed back (``BrowserFailed``).
        """
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
        except _failures() as e:
            self._drop(b)
            said = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            raise BrowserFailed(f"the browser on MiniWoB++ page {page} failed: {said}") from e
        except BaseException:
            self._give_back(b)
            raise
        else:
            self._give_back(b)

    def _give_back(self, b: Browser) -> None:
        with self.cond:
            self.idle.append(b)
            self.cond.notify()

    def _drop(self, b: Browser) -> None:
        b.close()
        with self.cond:
            self.every.remove(b)
            self.started -= 1
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            for b in self.every:
                b.close()
            self.every, self.idle, self.started = [], [], 0


POOL = _Pool()


def using(most: int, page: str, work: Callable[[Browser], T]) -> T:
    """``work`` on a browser of the pool (``most`` at once); once more on another if that browser failed (it
    is dropped: another idle one, or a new one). The environment restores an episode's state from scratch
    on every step, so a retry is the same work. A second failure raises, naming the page and what failed."""
    try:
        with POOL.borrow(most, page) as b:
            return work(b)
    except BrowserFailed:
        pass
    try:
        with POOL.borrow(most, page) as b:
            return work(b)
    except BrowserFailed as e:
        raise BrowserFailed(f"{e} (a second browser, after another failed)") from e
