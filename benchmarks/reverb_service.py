"""Reverb's API across processes: tfreplay.compat.reverb's gRPC server beside dm-reverb's, in interleaved rounds.

Run: `python -m benchmarks.reverb_service [--quick] [--rounds N]` in a venv where `tfreplay` imports (and
`reverb`, dm-reverb, for the comparison; without it the shim is measured alone). `make bench-reverb` runs it in
the compatibility venv (TF 2.15, dm-reverb 0.14).

Processes: for each library a server (its tables below) and up to 4 client processes, started once; the orchestrator
(this process, no TensorFlow) sends them commands. Servers listen on a free port; clients dial 127.0.0.1.

Items (one table each; uniform sampler, FIFO remover, `MinSize(1)`, the signature given):
  small  {observation: f32[3], action: f32[1], reward: f32[], discount: f32[], step_type: i32[]} (24 B a step)
  atari  {observation: u8[84,84,4], action: i32[]} (28,228 B a step)
Every item is the last 2 steps of a `TrajectoryWriter` (`num_keep_alive_refs=2`), created at every step from the
second one on: a writer of M steps makes M - 1 items.

Cases, per item kind (throughput; higher is better):
  insert xW   W writer processes (1 and 4), each M steps and `flush()`; items/s from the start signal (all writers
              connected and ready) to the last flush's return. The table is emptied before each.
  sample      `client.sample(table, B, emit_timesteps=False)` calls from one process on the filled table; samples/s.
  train       `TrajectoryDataset.from_table_signature(...).batch(B)` feeding a small `tf.function` train step
              (a 2-layer MLP; for Atari a strided conv, flatten, dense); steps/s. The floor beside it: the same step
              on a constant batch in the same process (TensorFlow's own cost).
Each round runs every case for both libraries, the order of the two alternating by round. A round's ratio is
shim / reverb; the table gives each figure's median and its min-max over rounds, and the ratio's. A ratio whose
min-max holds 1.0 is parity.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import statistics
import sys
import time
from typing import Any

ITEMS = {
    "small": {"observation": ([3], "float32"), "action": ([1], "float32"), "reward": ([], "float32"),
              "discount": ([], "float32"), "step_type": ([], "int32")},
    "atari": {"observation": ([84, 84, 4], "uint8"), "action": ([], "int32")},
}  # fmt: skip
SIZES = {  # steps per writer, sample batch, sample calls, train steps
    "full": {"small": (2000, 256, 20, 50), "atari": (300, 32, 20, 30)},
    "quick": {"small": (40, 16, 3, 3), "atari": (8, 4, 2, 2)},
}
SEQUENCE = 2
WRITERS = (1, 4)
LIBS = ("shim", "reverb")
COMMAND_TIMEOUT = 600.0


def library(lib: str) -> Any:
    if lib == "shim":
        from tfreplay.compat import reverb
    else:
        import reverb
    return reverb


def reverb_available() -> bool:
    """Whether `import reverb` (dm-reverb) works here, tried in a child process (this one has no TensorFlow)."""
    import subprocess

    try:
        return subprocess.run([sys.executable, "-c", "import reverb"], capture_output=True, timeout=300).returncode == 0
    except subprocess.TimeoutExpired:
        return False


# Worker processes: each serves commands from its pipe until "stop".
def serve_tables(lib: str, conn: Any) -> None:
    """A server process: `lib`'s Server with one table per item kind; its port sent back, then it waits for stop."""
    import tensorflow as tf

    rv = library(lib)
    tables = []
    for kind, spec in ITEMS.items():
        steps = max(s[kind][0] for s in SIZES.values())
        signature = {k: tf.TensorSpec([SEQUENCE, *shape], dtype) for k, (shape, dtype) in spec.items()}
        tables.append(
            rv.Table(kind, rv.selectors.Uniform(), rv.selectors.Fifo(), max(WRITERS) * steps,
                     rv.rate_limiters.MinSize(1), signature=signature)
        )  # fmt: skip
    server = rv.Server(tables)
    conn.send(server.port)
    conn.recv()
    server.stop()


def client_loop(conn: Any, go: Any) -> None:
    """A client process: runs `(command, kwargs)` from `conn` and sends back the result (or the error's text)."""
    commands = {"write": write, "sample": sample, "train": train, "floor": floor, "reset": reset}
    while True:
        message = conn.recv()
        if message is None:
            return
        name, kwargs = message
        try:
            conn.send(commands[name](conn=conn, go=go, **kwargs))
        except Exception as e:  # the orchestrator raises it
            conn.send(RuntimeError(f"{name}: {type(e).__name__}: {e}"))


def steps_of(kind: str, count: int) -> list:
    import numpy as np

    rng = np.random.default_rng(0)
    return [
        {k: rng.integers(0, 255, shape).astype(dtype) for k, (shape, dtype) in ITEMS[kind].items()}
        for _ in range(count)
    ]


def write(lib: str, address: str, kind: str, steps: int, conn: Any, go: Any) -> float:
    """Connects, says ready, waits for `go`, writes `steps` steps (an item per step from the second), flushes;
    returns `time.monotonic()` after the flush."""
    rv = library(lib)
    data = steps_of(kind, 8)
    client = rv.Client(address)
    client.server_info()  # connected before the start
    writer = client.trajectory_writer(num_keep_alive_refs=SEQUENCE)
    conn.send("ready")
    go.wait()
    for i in range(steps):
        writer.append(data[i % len(data)])
        if i + 1 >= SEQUENCE:
            history = writer.history
            writer.create_item(kind, 1.0, {k: history[k][-SEQUENCE:] for k in data[0]})
    writer.flush()
    end = time.monotonic()
    writer.close()
    return end


def reset(lib: str, address: str, kind: str, **_: Any) -> int:
    client = library(lib).Client(address)
    client.reset(kind)
    return int(client.server_info()[kind].current_size)


def sample(lib: str, address: str, kind: str, batch: int, calls: int, **_: Any) -> float:
    """Samples/s of `calls` calls of `client.sample(kind, batch, emit_timesteps=False)`, after one warm-up call."""
    client = library(lib).Client(address)
    draw = lambda: sum(1 for _ in client.sample(kind, batch, emit_timesteps=False))  # noqa: E731
    draw()
    start = time.perf_counter()
    drawn = sum(draw() for _ in range(calls))
    return drawn / (time.perf_counter() - start)


def train_step(kind: str) -> Any:
    """A `tf.function` step of plain SGD on the batch's data: a 2-layer MLP, or (atari) conv, flatten, dense."""
    import tensorflow as tf

    init = tf.random.stateless_normal
    if kind == "small":
        weights = [tf.Variable(init(s, [1, 2]) * 0.1) for s in ([14, 64], [64, 1])]
    else:
        weights = [tf.Variable(init(s, [1, 2]) * 0.01) for s in ([8, 8, 4, 16], [20 * 20 * 16, 1])]

    def features(data: dict) -> Any:
        if kind == "small":
            parts = [tf.reshape(tf.cast(v, tf.float32), [tf.shape(v)[0], -1]) for _, v in sorted(data.items())]
            return tf.nn.relu(tf.concat(parts, 1) @ weights[0])
        frames = tf.cast(data["observation"][:, 0], tf.float32) / 255.0
        conv = tf.nn.relu(tf.nn.conv2d(frames, weights[0], 4, "VALID"))
        return tf.reshape(conv, [tf.shape(conv)[0], -1])

    @tf.function
    def step(data: dict) -> Any:
        target = tf.reshape(tf.cast(data["action"], tf.float32), [tf.shape(data["action"])[0], -1])[:, 0]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.squeeze(features(data) @ weights[-1], -1) - target) ** 2)
        for w, g in zip(weights, tape.gradient(loss, weights)):
            w.assign_sub(1e-4 * g)
        return loss

    return step


def timed_steps(step: Any, batches: Any, count: int) -> float:
    """Steps/s of `count` calls of `step(next(batches))`, after 3 warm-up calls."""
    for _ in range(3):
        step(next(batches)).numpy()
    start = time.perf_counter()
    for _ in range(count):
        loss = step(next(batches))
    loss.numpy()
    return count / (time.perf_counter() - start)


def train(lib: str, address: str, kind: str, batch: int, steps: int, **_: Any) -> float:
    rv = library(lib)
    dataset = rv.TrajectoryDataset.from_table_signature(address, kind, max_in_flight_samples_per_worker=2 * batch)
    batches = iter(dataset.batch(batch, drop_remainder=True).map(lambda s: s.data).prefetch(1))
    try:
        return timed_steps(train_step(kind), batches, steps)
    finally:
        del batches


def floor(kind: str, batch: int, steps: int, **_: Any) -> float:
    """The train step's steps/s on one constant batch of the table's shapes."""
    import itertools

    import numpy as np
    import tensorflow as tf

    data = {k: tf.constant(np.stack([np.stack([v, v]) for v in [s[k] for s in steps_of(kind, batch)]]))
            for k in ITEMS[kind]}  # fmt: skip
    return timed_steps(train_step(kind), itertools.repeat(data), steps)


# The orchestrator.
class Pool:
    """The server and client processes; `close` ends every one of them."""

    def __init__(self, libs: tuple, clients: int):
        ctx = mp.get_context("spawn")
        self.go, self.procs, self.servers, self.clients = ctx.Event(), [], [], []
        try:
            for lib in libs:
                parent, child = ctx.Pipe()
                self._start(ctx, serve_tables, (lib, child), parent)
                self.servers.append(parent)
            for _ in range(clients):
                parent, child = ctx.Pipe()
                self._start(ctx, client_loop, (child, self.go), parent)
                self.clients.append(parent)
            self.addresses = {lib: f"127.0.0.1:{receive(conn)}" for lib, conn in zip(libs, self.servers)}
        except BaseException:
            self.close()
            raise

    def _start(self, ctx: Any, target: Any, args: tuple, conn: Any) -> None:
        proc = ctx.Process(target=target, args=args, daemon=True)
        proc.start()
        self.procs.append((proc, conn))

    def ask(self, client: int, command: str, **kwargs: Any) -> Any:
        self.clients[client].send((command, kwargs))
        return receive(self.clients[client])

    def inserts(self, lib: str, kind: str, writers: int, steps: int) -> float:
        """Items/s of `writers` writer processes from the start signal to the last flush."""
        self.ask(0, "reset", lib=lib, address=self.addresses[lib], kind=kind)
        for conn in self.clients[:writers]:
            conn.send(("write", dict(lib=lib, address=self.addresses[lib], kind=kind, steps=steps)))
        for conn in self.clients[:writers]:
            assert receive(conn) == "ready"
        start = time.monotonic()
        self.go.set()
        ends = [receive(conn) for conn in self.clients[:writers]]
        self.go.clear()
        return writers * (steps - SEQUENCE + 1) / (max(ends) - start)

    def close(self) -> list:
        """Ends every process (a stop message, then a kill after 30 s); their exit codes (0: a clean stop)."""
        for conn in self.clients + self.servers:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc, _ in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        return [proc.exitcode for proc, _ in self.procs]


def receive(conn: Any) -> Any:
    if not conn.poll(COMMAND_TIMEOUT):
        raise TimeoutError(f"no answer from a worker process within {COMMAND_TIMEOUT:g} s")
    answer = conn.recv()
    if isinstance(answer, Exception):
        raise answer
    return answer


def one_round(pool: Pool, libs: tuple, sizes: dict, writers: tuple) -> dict:
    """Every case of every kind once for each library; {case: {lib: value}} (the floor under lib 'floor')."""
    out: dict = {}
    for kind, (steps, batch, calls, train_steps) in sizes.items():
        for w in writers:
            out[f"{kind} insert x{w}"] = {lib: pool.inserts(lib, kind, w, steps) for lib in libs}
        out[f"{kind} sample"] = {
            lib: pool.ask(0, "sample", lib=lib, address=pool.addresses[lib], kind=kind, batch=batch, calls=calls)
            for lib in libs
        }
        out[f"{kind} train"] = {
            lib: pool.ask(0, "train", lib=lib, address=pool.addresses[lib], kind=kind, batch=batch, steps=train_steps)
            for lib in libs
        }
        out[f"{kind} train"]["floor"] = pool.ask(0, "floor", kind=kind, batch=batch, steps=train_steps)
    return out


def spread(values: list, ratio: bool = False) -> str:
    """`median (min-max)`: ratios to 2 decimals, throughputs to 2 decimals below 10, else whole."""
    fmt = (lambda v: f"{v:,.2f}") if ratio or max(values) < 10 else (lambda v: f"{v:,.0f}")
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def table(rounds: list, libs: tuple) -> list:
    units = {"insert": "items/s", "sample": "samples/s", "train": "steps/s"}
    lines = [
        "| case | unit | " + " | ".join(libs) + " | shim / reverb | floor |",
        "|---|---|" + "---:|" * (len(libs) + 2),
    ]
    for case in rounds[0]:
        values = {lib: [r[case][lib] for r in rounds] for lib in libs}
        cells = [spread(values[lib]) for lib in libs]
        ratio = "-"
        if "reverb" in libs:
            ratios = [s / r for s, r in zip(values["shim"], values["reverb"])]
            ratio = spread(ratios, ratio=True) + (" parity" if min(ratios) <= 1.0 <= max(ratios) else "")
        fl = spread([r[case]["floor"] for r in rounds]) if "floor" in rounds[0][case] else "-"
        lines.append(f"| {case} | {units[case.split()[1]]} | " + " | ".join(cells) + f" | {ratio} | {fl} |")
    return lines


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke test, figures meaningless")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shim-only", action="store_true", help="leave dm-reverb out even where it imports")
    parser.add_argument("--writers", default=",".join(map(str, WRITERS)), help="writer process counts, e.g. 1,4")
    parser.add_argument("--out", default=".benchmarks/reverb_service.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["TFREPLAY_REVERB_HOST"] = "127.0.0.1"
    with_reverb = reverb_available() and not args.shim_only
    libs = LIBS if with_reverb else ("shim",)
    if not with_reverb:
        print("dm-reverb is not measured (" + ("--shim-only" if args.shim_only else "`import reverb` fails") + ")")
    writers = tuple(int(w) for w in args.writers.split(","))
    sizes = SIZES["quick" if args.quick else "full"]
    loads, rounds = [os.getloadavg()], []
    pool = Pool(libs, max(writers))
    try:
        for r in range(args.rounds):
            order = libs if r % 2 == 0 else libs[::-1]
            rounds.append(one_round(pool, order, sizes, writers))
            loads.append(os.getloadavg())
            print(f"round {r + 1}/{args.rounds} done, load average {loads[-1][0]:.2f}", file=sys.stderr)
    finally:
        exitcodes = pool.close()
    print(f"sizes (steps per writer, batch, sample calls, train steps): {sizes}; rounds: {args.rounds}")
    print(f"1-minute load average: {loads[0][0]:.2f} at the start, {max(x[0] for x in loads):.2f} at most")
    print("\n".join(table(rounds, libs)))
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(libs=libs, sizes=sizes, rounds=rounds, loads=loads, exitcodes=exitcodes), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
