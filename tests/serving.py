"""A real `aiayn serve` in a subprocess on a free loopback port, for the server and page tests."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiayn

SRC = Path(aiayn.__file__).resolve().parent.parent  # the aiayn these tests import, for the child


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment (with `extra`) for a child `python -m aiayn`: the aiayn tested first."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return env


class ServerProcess:
    """`python -m aiayn serve --model DIR --port 0 FLAGS...`, started and waited for."""

    def __init__(self, model_dir: Path, *flags: str, env: dict[str, str] | None = None,
                 access_log: bool = False):  # fmt: skip
        quiet = [] if access_log else ["--no-access-log"]
        cmd = [sys.executable, "-m", "aiayn", "serve", "--model", str(model_dir), "--port", "0",
               "--threads", "1", *quiet, *flags]  # fmt: skip
        self.err = tempfile.TemporaryFile("w+")  # noqa: SIM115  (a file, not a pipe: never blocks)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=child_env(env))  # fmt: skip
        self.lines: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"aiayn serve did not start: {self.stderr()[-2000:]}")
            self.lines.append(line)
            if m := re.search(r"on (http://127\.0\.0\.1:\d+)/", line):
                self.url = m.group(1)
                return
        raise RuntimeError("aiayn serve did not start in 120 s")

    def stop(self, timeout: float = 60) -> tuple[int, str, str]:
        """SIGTERM, then (exit status, the rest of stdout, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return self.proc.returncode, out, self.stderr()

    def rss_mb(self) -> float:
        """The server's resident memory now (Linux /proc), in MiB."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()
