"""How long `SSEParser` takes over one long line fed in small reads (a line joined at every read
costs quadratic time; joined once, linear).

    .venv/bin/python bench/sse_parse.py [--mb 16] [--read 4096] [--src OTHER_CHECKOUT/src]

Measured on 2026-12-01, 16 MB in 4 KB reads: 27.0 s on 0d99606, 0.087 s after c975dc9.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=16)
    parser.add_argument("--read", type=int, default=4096, help="bytes a read brings")
    parser.add_argument("--src", help="time another checkout's parser (its src directory)")
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, args.src)
    from tether.providers.http import SSEParser

    line = b'data: {"x": "' + b"a" * (args.mb * 1_000_000) + b'"}\n\n'
    p = SSEParser()
    started = time.perf_counter()
    events = []
    for i in range(0, len(line), args.read):
        events += p.feed(line[i : i + args.read])
    took = time.perf_counter() - started
    assert len(events) == 1 and len(events[0][1]) == len(line) - 8
    print(f"one {args.mb} MB line in {args.read}-byte reads: {took:.3f} s")


if __name__ == "__main__":
    main()
