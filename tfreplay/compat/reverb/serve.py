"""A standalone Reverb server: tables from a JSON config, served until stopped (SIGTERM or Ctrl-C).

    tfreplay-reverb-server --config server.json
    python -m tfreplay.compat.reverb.serve --config server.json

The config:

    {"port": 8008,                       (0 or absent: a free port)
     "host": "[::]",                     (absent: all interfaces, or $TFREPLAY_REVERB_HOST)
     "checkpoint_dir": "/data/ckpt",     (absent: no checkpoints kept; the latest one is loaded at start)
     "tables": [{"name": "replay",
                 "sampler": "uniform",   (or "fifo", "lifo", "min_heap", "max_heap",
                                          {"kind": "prioritized", "priority_exponent": 0.8})
                 "remover": "fifo",
                 "max_size": 100000,
                 "rate_limiter": {"kind": "min_size", "min_size_to_sample": 1},
                                         (kinds: min_size, sample_to_insert_ratio, queue, stack, rate_limiter;
                                          the other keys are that limiter's arguments)
                 "max_times_sampled": 0,
                 "signature": {"obs": {"shape": [None, 4], "dtype": "float32"}}}]}   (optional; lists for tuples)

Once it serves, it prints `serving tables [...] on port N` (one line, flushed).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any, Sequence

SELECTORS = {"uniform": "Uniform", "fifo": "Fifo", "lifo": "Lifo", "min_heap": "MinHeap", "max_heap": "MaxHeap"}
LIMITERS = {
    "min_size": "MinSize",
    "sample_to_insert_ratio": "SampleToInsertRatio",
    "queue": "Queue",
    "stack": "Stack",
    "rate_limiter": "RateLimiter",
}


def _selector(where: str, value: Any) -> Any:
    from tfreplay.compat.reverb import selectors

    if isinstance(value, str) and value in SELECTORS:
        return getattr(selectors, SELECTORS[value])()
    if isinstance(value, dict) and value.get("kind") == "prioritized" and set(value) == {"kind", "priority_exponent"}:
        return selectors.Prioritized(value["priority_exponent"])
    raise ValueError(
        f"{where} ({value!r}) must be one of {sorted(SELECTORS)} or "
        '{"kind": "prioritized", "priority_exponent": <number>}.'
    )


def _limiter(where: str, value: Any) -> Any:
    from tfreplay.compat.reverb import rate_limiters

    if not isinstance(value, dict) or value.get("kind") not in LIMITERS:
        raise ValueError(f"{where} ({value!r}) must be an object whose 'kind' is one of {sorted(LIMITERS)}.")
    args = {k: v for k, v in value.items() if k != "kind"}
    try:
        return getattr(rate_limiters, LIMITERS[value["kind"]])(**args)
    except TypeError as e:
        raise ValueError(f"{where} ({value!r}) has arguments its kind does not take: {e}.") from None


def _signature(where: str, value: Any) -> Any:
    import tensorflow as tf

    if isinstance(value, dict) and set(value) in ({"shape", "dtype"}, {"shape", "dtype", "name"}):
        try:
            return tf.TensorSpec(value["shape"], tf.as_dtype(value["dtype"]), value.get("name"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where} ({value!r}) must be a valid shape and dtype: {e}.") from None
    if isinstance(value, dict):
        return {k: _signature(f"{where}.{k}", v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_signature(f"{where}[{i}]", v) for i, v in enumerate(value))
    raise ValueError(f"{where} ({value!r}) must be a {{'shape', 'dtype'}} object, an object or a list of them.")


def tables_from_config(config: dict) -> list:
    """The `Table`s a config describes (ValueError naming the first wrong field)."""
    from tfreplay.compat.reverb import Table

    tables = config.get("tables")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"config: tables ({tables!r}) must be a non-empty list of table objects.")
    out = []
    for i, t in enumerate(tables):
        where = f"config: tables[{i}]"
        known = {"name", "sampler", "remover", "max_size", "rate_limiter", "max_times_sampled", "signature"}
        if not isinstance(t, dict) or set(t) - known:
            raise ValueError(f"{where} ({t!r}) must be an object with keys among {sorted(known)}.")
        out.append(
            Table(
                name=t.get("name"),  # type: ignore[arg-type]  # Table checks it
                sampler=_selector(f"{where}.sampler", t.get("sampler", "uniform")),
                remover=_selector(f"{where}.remover", t.get("remover", "fifo")),
                max_size=t.get("max_size"),  # type: ignore[arg-type]
                rate_limiter=_limiter(f"{where}.rate_limiter", t.get("rate_limiter")),
                max_times_sampled=t.get("max_times_sampled", 0),
                signature=None if t.get("signature") is None else _signature(f"{where}.signature", t["signature"]),
            )
        )
    return out


def serve(config: dict) -> Any:
    """Starts the server a config describes; returns it."""
    from tfreplay.compat import reverb

    port = config.get("port") or None
    host = config.get("host")
    if host is not None and not isinstance(host, str):
        raise TypeError(f"config: host ({host!r}) must be a string, e.g. '127.0.0.1'.")
    folder = config.get("checkpoint_dir")
    checkpointer = None if folder is None else reverb.checkpointers.DefaultCheckpointer(folder)
    return reverb.Server(tables_from_config(config), port=port, checkpointer=checkpointer, host=host)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfreplay-reverb-server", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the JSON config file (see the module's doc)")
    parser.add_argument("--port", type=int, default=None, help="overrides the config's port")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    if args.port is not None:
        config["port"] = args.port
    server = serve(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    print(f"serving tables {sorted(server.tables)} on port {server.port}", flush=True)
    server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
