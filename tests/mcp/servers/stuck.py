"""An MCP server that never gets going: it ignores SIGTERM, starts a helper process that ignores
it too, and never answers `initialize`. Each of them writes its process id as a JSON line to the
file named by $RECORD, and the server writes {"stdin": "closed"} once its stdin ends (the client's
first step in stopping it), then carries on hanging."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def record(entry: dict[str, object]) -> None:
    with open(os.environ["RECORD"], "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.argv[1:2] == ["helper"]:
        record({"pid": os.getpid(), "role": "helper"})
    else:
        record({"pid": os.getpid(), "role": "server"})
        subprocess.Popen([sys.executable, __file__, "helper"])  # in its group, holding its stdout too
        sys.stdin.buffer.read()  # until the client closes it
        record({"stdin": "closed"})
    while True:  # never ends on its own: only the process group's SIGKILL stops it (what the test is about)
        signal.pause()
