#!/usr/bin/env python3
"""Bubble fraction of a pipeline run from its colossal_train --trace files.

For every stage (one trace file per rank) and every step after the first, the pipeline window runs
from the step's first forward or receive to its last backward; the bubble is the part of that
window the stage spent neither in forward nor in backward. Prints the mean over steps per stage.
usage: pipeline_bubble.py TRACE.rank0.json [TRACE.rank1.json ...]
"""
import json
import sys


def bubbles(path):
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    events.sort(key=lambda e: e["ts"])
    steps, current = [], []
    for e in events:
        if e["cat"] == "optimizer":
            steps.append(current)
            current = []
        else:
            current.append(e)
    fractions = []
    for step in steps[1:]:  # the first step pays for first-touch page faults
        work = [e for e in step if e["cat"] in ("forward", "backward", "receive")]
        if not work:
            continue
        begin = min(e["ts"] for e in work)
        end = max(e["ts"] + e["dur"] for e in step if e["cat"] in ("forward", "backward"))
        busy = sum(e["dur"] for e in step if e["cat"] in ("forward", "backward"))
        fractions.append(1.0 - busy / (end - begin))
    return sum(fractions) / len(fractions)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    values = [bubbles(p) for p in sys.argv[1:]]
    print(" ".join(f"{v:.3f}" for v in values), f"mean {sum(values) / len(values):.3f}")
