#!/usr/bin/env python3
"""Independent check of planner::pinned_step (tests/test_cost_model.cpp,
PinnedRanksTakeTheirCoresPieceByPiece): ranks pinned round-robin to shared cores, each core
running one piece (a stage replica's micro-batch forward or backward) at a time to its end, in
the order their ranks became runnable (inputs arrived and the previous piece done). Written
apart from the C++ (its own 1F1B order and event loop); prints the makespans the test expects.
Plain Python, run by hand:

    python3 tests/reference/pinned_cores.py
"""


def one_f_one_b(stages, stage, micro):
    """Stage `stage`'s order: warm-up forwards, then alternate, then the remaining backwards."""
    warm = min(stages - stage - 1, micro)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < micro:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    order += [("B", i) for i in range(b, micro)]
    return order


def makespan(data, tensor, stages, micro, cores, fwd=1.0, bwd=2.0, per_node=0):
    """`cores` per node; nodes hold `per_node` consecutive ranks (0: one node)."""
    per_node = per_node or data * tensor * stages

    def core(rank):  # a global core number
        return (rank // per_node, rank % per_node % cores)

    replicas = {}
    for d in range(data):
        for s in range(stages):
            ranks = [t + tensor * (d + data * s) for t in range(tensor)]
            replicas[(d, s)] = sorted({core(r) for r in ranks})
    orders = {e: one_f_one_b(stages, e[1], micro) for e in replicas}
    position = {e: 0 for e in replicas}
    finished = {}
    last_end = {e: 0.0 for e in replicas}  # when each replica's previous piece ended
    running = {}
    core_free = {}
    now = 0.0

    def inputs_at(e):
        kind, i = orders[e][position[e]]
        d, s = e
        if kind == "F":
            return 0.0 if s == 0 else finished.get(((d, s - 1), "F", i))
        if s == stages - 1:
            return finished.get((e, "F", i))
        return finished.get(((d, s + 1), "B", i))

    while True:
        ready = []
        for e in replicas:
            if e in running or position[e] >= len(orders[e]):
                continue
            t = inputs_at(e)
            if t is not None and t <= now + 1e-12:
                ready.append((max(t, last_end[e]), e))  # runnable since
        for _, e in sorted(ready):
            if all(core_free.get(c, 0.0) <= now + 1e-12 for c in replicas[e]):
                members = [core(t + tensor * (e[0] + data * e[1])) for t in range(tensor)]
                crowd = max(members.count(c) for c in replicas[e])
                seconds = crowd * (fwd if orders[e][position[e]][0] == "F" else bwd)
                for c in replicas[e]:
                    core_free[c] = now + seconds
                running[e] = now + seconds
        if not running:
            return now
        now = min(running.values())
        for e in [e for e, end in running.items() if end <= now + 1e-12]:
            del running[e]
            kind, i = orders[e][position[e]]
            finished[(e, kind, i)] = now
            last_end[e] = now
            position[e] += 1


if __name__ == "__main__":
    for name, args in [("1 x p2, m2, 2 cores", (1, 1, 2, 2, 2)),
                       ("1 x p4, m4, 4 cores", (1, 1, 4, 4, 4)),
                       ("d4, m1, 2 cores", (4, 1, 1, 1, 2)),
                       ("t4, m1, 2 cores", (1, 4, 1, 1, 2)),
                       ("p4, m4, 2 cores", (1, 1, 4, 4, 2)),
                       ("p4, m8, 2 cores", (1, 1, 4, 8, 2)),
                       ("d2 x p2, m2, 2 cores", (2, 1, 2, 2, 2)),
                       ("t2 x p2, m4, 2 cores", (1, 2, 2, 4, 2)),
                       ("d4 x p2, m2, 2 x 2 cores", (4, 1, 2, 2, 2, 1.0, 2.0, 4)),
                       ("d4 x p2, m2, 4 cores", (4, 1, 2, 2, 4))]:
        print(f"{name:24} {makespan(*args):g}")
