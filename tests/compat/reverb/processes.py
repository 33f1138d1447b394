"""Processes for the transport's tests: a Reverb server from a config (`serve`) and client scripts, all on
127.0.0.1, each bounded by a timeout and ended by its owner."""

from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
ENV = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    TF_CPP_MIN_LOG_LEVEL="2",
    TFREPLAY_REVERB_HOST="127.0.0.1",
)
START_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`python -m tfreplay.compat.reverb.serve --config <config>` in a subprocess; `address` once it serves."""

    def __init__(self, config: dict, folder: pathlib.Path):
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"server-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(config))
        self.log = open(folder / f"{path.stem}.log", "w")  # noqa: SIM115 (closed in stop)
        command = [sys.executable, "-m", "tfreplay.compat.reverb.serve", "--config", str(path)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT, env=ENV, text=True)
        self.port = self._read_port()
        self.address = f"127.0.0.1:{self.port}"

    def _read_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 1.0)
            if ready:
                line = self.process.stdout.readline()
                if line.startswith("serving tables"):
                    return int(line.split()[-1])
            if self.process.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"the server did not start: {pathlib.Path(self.log.name).read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Ends the server (SIGTERM: a clean stop; SIGKILL: a crash); its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.log.close()
        return self.process.returncode


def client_process(script: str, *args: str) -> subprocess.Popen:
    """`script` (Python source; `sys.argv[1:]` are `args`) in a subprocess whose stdout is a pipe."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=ENV,
        text=True,
    )


def finish(process: subprocess.Popen, timeout: float = 120.0) -> str:
    """Waits for `process` (killed past `timeout`); its stdout, or AssertionError with its stderr."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    assert process.returncode == 0, err[-4000:]
    return out


def end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.communicate()
