"""Write a lock file: the exact version of every package a fresh install resolves today.

    make lock            # re-resolve both stacks from the index: constraints.txt (cpu), constraints-cuda.txt

``make venv`` installs with ``-c constraints.txt`` (``-c constraints-cuda.txt`` with DEVICE=cuda), so a new
machine gets exactly the versions the suite was run with, and the next release of a dependency cannot break an
install until the lock is refreshed (and the suite run) on purpose. Reads pip's installation report
(``pip install --dry-run --report``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HEADER = """\
# Exact versions of a fresh install, resolved by `make lock` (.ci/lock.py); `make venv` installs with -c.
# Refresh on purpose (make lock, then make test) and commit; never edit by hand.
"""


def main() -> None:
    report, out = Path(sys.argv[1]), Path(sys.argv[2])
    pins = {}
    for item in json.loads(report.read_text())["install"]:
        meta = item["metadata"]
        if item.get("download_info", {}).get("dir_info", {}).get("editable"):
            continue  # the project itself
        pins[re.sub(r"[-_.]+", "-", meta["name"]).lower()] = meta["version"]  # PEP 503 names
    if not pins:
        sys.exit(f"{report}: pip resolved nothing; constraints not written")
    out.write_text(HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins)))
    print(f"{out}: {len(pins)} packages pinned")


if __name__ == "__main__":
    main()
