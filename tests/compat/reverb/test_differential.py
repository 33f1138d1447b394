"""The same seeded scripts through real Reverb (dm-reverb, where it installs: the TF 2.15 lane) and the shim.

What a user can see is compared: the values drawn (in order, for the deterministic selectors), the reported
probabilities and priorities, table sizes, `can_sample` / `can_insert`. Run without the redirect plugin (it would
make `import reverb` the shim): `make test-reverb` runs this file in a pytest of its own.
"""

from __future__ import annotations

import numpy as np
import pytest

real = pytest.importorskip("reverb")
from tfreplay.compat import reverb as shim  # noqa: E402

if real is shim:
    pytest.skip("`import reverb` gives the shim in this process (redirect plugin)", allow_module_level=True)


def run(lib, sampler, remover, script, max_size=8, max_times_sampled=0, limiter=None):
    """Runs `script` (ops: ("insert", value, priority), ("sample", n), ("update", index, priority)) and returns
    what was seen: each sample's value, probability and priority, and each step's size and can_sample(1)."""
    limiter = limiter(lib) if limiter else lib.rate_limiters.MinSize(1)
    table = lib.Table("t", sampler(lib), remover(lib), max_size, limiter, max_times_sampled=max_times_sampled)
    server = lib.Server([table])
    client = lib.Client(f"localhost:{server.port}")
    keys, seen = {}, []
    with client.trajectory_writer(1) as writer:
        for op in script:
            if op[0] == "insert":
                writer.append(np.int64(op[1]))
                writer.create_item("t", op[2], writer.history[-1])
                writer.flush()
            elif op[0] == "sample":
                if not table.can_sample(op[1]):  # both would wait for ever
                    seen.append(("refused",))
                    continue
                for s in client.sample("t", op[1], emit_timesteps=False):
                    keys.setdefault(int(s.data[0]), s.info.key)
                    seen.append(("draw", int(s.data[0]), round(s.info.probability, 9), s.info.priority))
            elif op[1] in keys:  # a key is known once its item was drawn
                client.mutate_priorities("t", updates={keys[op[1]]: op[2]})
            seen.append(("size", table.info.current_size, table.can_sample(1)))
    server.stop()
    return seen


def script(seed: int, n: int = 40) -> list:
    rng = np.random.default_rng(seed)
    ops, inserted = [], 0
    for _ in range(n):
        kind = rng.choice(["insert", "insert", "sample", "update"]) if inserted else "insert"
        if kind == "insert":
            ops.append(("insert", inserted, float(rng.integers(1, 5))))
            inserted += 1
        elif kind == "sample":
            ops.append(("sample", 1))
        else:
            ops.append(("update", int(rng.integers(inserted)), float(rng.integers(1, 5))))
    return ops


DETERMINISTIC = {
    "fifo": lambda lib: lib.selectors.Fifo(),
    "lifo": lambda lib: lib.selectors.Lifo(),
    "min_heap": lambda lib: lib.selectors.MinHeap(),
    "max_heap": lambda lib: lib.selectors.MaxHeap(),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sampler", sorted(DETERMINISTIC))
@pytest.mark.parametrize("remover", ["fifo", "lifo"])
@pytest.mark.parametrize("max_times_sampled", [0, 1, 2])
def test_deterministic_selectors_draw_as_reverb(seed, sampler, remover, max_times_sampled):
    ops = script(seed)
    if sampler.endswith("heap"):  # updates of items already removed: both ignore them; keep keys known
        ops = [op for op in ops if op[0] != "update"]
    args = (DETERMINISTIC[sampler], DETERMINISTIC[remover], ops)
    kwargs = {"max_size": 5, "max_times_sampled": max_times_sampled}
    assert run(shim, *args, **kwargs) == run(real, *args, **kwargs)


@pytest.mark.parametrize("exponent", [0.5, 1.0])
def test_prioritized_reports_the_probabilities_reverb_reports(exponent):
    ops = [("insert", i, float(i + 1)) for i in range(4)] + [("update", 2, 9.0)] + [("sample", 1)] * 60

    def probabilities(lib):
        seen = run(lib, lambda lib: lib.selectors.Prioritized(exponent), DETERMINISTIC["fifo"], ops)
        return {v: (p, q) for kind, v, *rest in seen if kind == "draw" for p, q in [rest]}

    mine, theirs = probabilities(shim), probabilities(real)
    for value in set(mine) & set(theirs):
        assert mine[value] == pytest.approx(theirs[value], rel=1e-9)


def test_a_queue_admits_and_refuses_as_reverb():
    def seen(lib):
        table = lib.Table.queue("q", 3)
        server = lib.Server([table])
        client = lib.Client(f"localhost:{server.port}")
        out = []
        with client.trajectory_writer(1) as writer:
            for i in range(3):
                writer.append(np.int64(i))
                writer.create_item("q", 1.0, writer.history[-1])
                writer.flush()
                out.append((table.can_insert(1), table.can_sample(1), table.info.current_size))
        out.append([int(s.data[0]) for s in client.sample("q", 2, emit_timesteps=False)])
        out.append((table.can_insert(1), table.can_sample(1), table.info.current_size))
        server.stop()
        return out

    assert seen(shim) == seen(real)
