"""The legality checker, one case per failure mode: each edit of a hand-written JSCoP is refused
with a message naming what it breaks (dependence kind, statement pair, array), or accepted."""

from __future__ import annotations

import copy

import pytest

from polyml.scop import dependences, legality
from polyml.scop.jscop import JscopError


def stmt(name: str, domain: str, schedule: str, *accesses: tuple[str, str]) -> dict:
    return {"name": name, "domain": domain, "schedule": schedule,
            "accesses": [{"kind": k, "relation": r} for k, r in accesses]}


def scop(*stmts: dict) -> dict:
    return {"name": "%entry---%exit", "context": "{ : }", "arrays": [], "statements": list(stmts)}


#: S writes A, T reads it: a flow dependence S -> T
PRODUCER_CONSUMER = scop(
    stmt("S", "{ S[i] : 0 <= i <= 9 }", "{ S[i] -> [0, i] }", ("write", "{ S[i] -> A[i] }")),
    stmt("T", "{ T[i] : 0 <= i <= 9 }", "{ T[i] -> [1, i] }", ("read", "{ T[i] -> A[i] }"), ("write", "{ T[i] -> B[i] }")),
)
#: R reads A before W overwrites it: an anti dependence R -> W
READ_THEN_WRITE = scop(
    stmt("R", "{ R[i] : 0 <= i <= 9 }", "{ R[i] -> [0, i] }", ("read", "{ R[i] -> A[i] }"), ("write", "{ R[i] -> B[i] }")),
    stmt("W", "{ W[i] : 0 <= i <= 9 }", "{ W[i] -> [1, i] }", ("write", "{ W[i] -> A[i] }")),
)
#: two writes of A, the second must win: an output dependence S1 -> S2
TWO_WRITES = scop(
    stmt("S1", "{ S1[i] : 0 <= i <= 9 }", "{ S1[i] -> [0, i] }", ("write", "{ S1[i] -> A[i] }")),
    stmt("S2", "{ S2[i] : 0 <= i <= 9 }", "{ S2[i] -> [1, i] }", ("write", "{ S2[i] -> A[i] }")),
)
#: A[i][j] = A[i-1][j+1]: distance (1, -1), interchange is illegal
STENCIL = scop(
    stmt("S", "{ S[i, j] : 1 <= i <= 8 and 0 <= j <= 7 }", "{ S[i, j] -> [i, j] }",
         ("read", "{ S[i, j] -> A[i - 1, j + 1] }"), ("write", "{ S[i, j] -> A[i, j] }")),
)
#: s += x[i]: a chain of dependences along i
REDUCTION = scop(
    stmt("S", "{ S[i] : 0 <= i <= 9 }", "{ S[i] -> [i] }",
         ("read", "{ S[i] -> s[] }"), ("read", "{ S[i] -> x[i] }"), ("write", "{ S[i] -> s[] }")),
)
#: C[i][j] = sum_k A[i][k] * B[k][j] after C = 0: (i, j) permutable, k carries the reduction
GEMM = scop(
    stmt("I", "{ I[i, j] : 0 <= i <= 7 and 0 <= j <= 7 }", "{ I[i, j] -> [0, i, j, 0] }", ("write", "{ I[i, j] -> C[i, j] }")),
    stmt("P", "{ P[i, k, j] : 0 <= i <= 7 and 0 <= k <= 7 and 0 <= j <= 7 }", "{ P[i, k, j] -> [1, i, k, j] }",
         ("read", "{ P[i, k, j] -> C[i, j] }"), ("read", "{ P[i, k, j] -> A[i, k] }"), ("read", "{ P[i, k, j] -> B[k, j] }"),
         ("write", "{ P[i, k, j] -> C[i, j] }")),
)


def edit(base: dict, **schedules: str) -> dict:
    new = copy.deepcopy(base)
    for s in new["statements"]:
        if s["name"] in schedules:
            s["schedule"] = schedules[s["name"]]
    return new


def mutate(base: dict, fn) -> dict:
    new = copy.deepcopy(base)
    fn(new)
    return new


ILLEGAL = [
    pytest.param(PRODUCER_CONSUMER, edit(PRODUCER_CONSUMER, S="{ S[i] -> [1, i] }", T="{ T[i] -> [0, i] }"),
                 ["read-after-write (flow) dependence S -> T on array A", "S[0] must run before T[0]"], id="raw-consumer-first"),
    pytest.param(READ_THEN_WRITE, edit(READ_THEN_WRITE, R="{ R[i] -> [1, i] }", W="{ W[i] -> [0, i] }"),
                 ["write-after-read (anti) dependence R -> W on array A"], id="war-overwrite-before-read"),
    pytest.param(TWO_WRITES, edit(TWO_WRITES, S1="{ S1[i] -> [1, i] }", S2="{ S2[i] -> [0, i] }"),
                 ["write-after-write (output) dependence S1 -> S2 on array A"], id="waw-writes-swapped"),
    pytest.param(STENCIL, edit(STENCIL, S="{ S[i, j] -> [j, i] }"),
                 ["read-after-write (flow) dependence S -> S on array A", "after it"], id="loop-carried-interchange"),
    pytest.param(REDUCTION, edit(REDUCTION, S="{ S[i] -> [-i] }"),
                 ["read-after-write (flow) dependence S -> S on array s"], id="reduction-reversed"),
    pytest.param(REDUCTION, edit(REDUCTION, S="{ S[i] -> [0] }"),
                 ["dependence S -> S on array s", "at the same time"], id="instances-at-the-same-time"),
    pytest.param(GEMM, edit(GEMM, I="{ I[i, j] -> [1, i, j, 8] }"),
                 ["dependence I -> P on array C"], id="init-after-product"),
    pytest.param(GEMM, edit(GEMM, P="{ P[i, k, j] -> [1, i, 7 - k, j] }"),
                 ["dependence P -> P on array C"], id="reduction-order-reversed"),
]


@pytest.mark.parametrize("base,new,expected", ILLEGAL)
def test_illegal_schedule_is_refused_naming_the_dependence(base, new, expected) -> None:
    with pytest.raises(legality.IllegalScheduleError) as e:
        legality.check(base, new, "f___%entry---%exit.jscop")
    msg = str(e.value)
    assert msg.startswith("f___%entry---%exit.jscop: illegal schedule")
    for part in expected:
        assert part in msg, msg


STRUCTURAL = [
    pytest.param(lambda j: j["statements"].pop(), "the statements must stay ['I', 'P']", id="statement-removed"),
    pytest.param(lambda j: j["statements"].reverse(), "in this order", id="statements-reordered"),
    pytest.param(lambda j: j["statements"][0].update(domain="{ I[i, j] : 0 <= i <= 3 and 0 <= j <= 7 }"),
                 "statement I: the domain changed", id="domain-edited"),
    pytest.param(lambda j: j["statements"][1]["accesses"][1].update(relation="{ P[i, k, j] -> A[k, i] }"),
                 "statement P: access 1 changed", id="access-edited"),
    pytest.param(lambda j: j["statements"][1]["accesses"].pop(), "statement P: the accesses changed", id="access-removed"),
    pytest.param(lambda j: j["statements"][0].update(schedule="{ I[i, j] -> [0, i j] }"),
                 "statement I: schedule: cannot parse", id="schedule-unparsable"),
    pytest.param(lambda j: j["statements"][0].update(schedule="{ I[i] -> [0, i] }"),
                 "statement I: the schedule { I[i] -> [0, i] } must map I instances (2 dimensions)", id="schedule-wrong-arity"),
    pytest.param(lambda j: j["statements"][0].update(schedule="{ X[i, j] -> [0, i, j, 0] }"),
                 "must map I instances", id="schedule-wrong-statement"),
    pytest.param(lambda j: j["statements"][0].update(schedule="{ I[i, j] -> [0, i, j, 0] : i <= 3 }"),
                 "does not give every instance a time", id="schedule-partial"),
    pytest.param(lambda j: j["statements"][0].update(schedule="{ I[i, j] -> [0, i, j, t] : 0 <= t <= 1 }"),
                 "gives an instance several times", id="schedule-not-a-function"),
    pytest.param(lambda j: j.update(context="[n] -> { : n > 0 }"), "the context changed", id="context-edited"),
    pytest.param(lambda j: j["statements"][0].pop("accesses"), "missing key 'accesses'", id="malformed"),
]


@pytest.mark.parametrize("change,expected", STRUCTURAL)
def test_edit_that_changes_the_scop_is_refused(change, expected) -> None:
    with pytest.raises(JscopError) as e:
        legality.check(GEMM, mutate(GEMM, change), "f.jscop")
    assert expected in str(e.value)


@pytest.mark.parametrize("new", [
    pytest.param(edit(GEMM, P="{ P[i, k, j] -> [1, i, j, k] }"), id="interchange-k-j"),
    pytest.param(edit(GEMM, I="{ I[i, j] -> [0, j, i, 0] }"), id="interchange-init"),
    pytest.param(edit(GEMM, P="{ P[i, k, j] -> [1, floor(i/4), floor(j/4), i, k, j] }",
                      I="{ I[i, j] -> [0, i, j, 0, 0, 0] }"), id="tile-and-pad"),
    pytest.param(edit(STENCIL, S="{ S[i, j] -> [i, -j] }"), id="independent-dim-reversed"),
    pytest.param(edit(PRODUCER_CONSUMER, S="{ S[i] -> [i, 0] }", T="{ T[i] -> [i, 1] }"), id="fusion"),
])
def test_legal_edits_pass(new) -> None:
    base = {s["name"] for s in new["statements"]}
    orig = next(b for b in (GEMM, STENCIL, PRODUCER_CONSUMER) if {s["name"] for s in b["statements"]} == base)
    legality.check(orig, new, "f.jscop")


def test_dependences_of_gemm() -> None:
    d = dependences.compute(GEMM)
    import islpy as isl

    assert d.raw.is_equal(isl.UnionMap(
        "{ I[i, j] -> P[i, 0, j]; P[i, k, j] -> P[i, k + 1, j] : k <= 6 }").intersect_domain(
        isl.UnionSet("{ I[i, j] : 0 <= i <= 7 and 0 <= j <= 7; P[i, k, j] : 0 <= i, k, j <= 7 }")))
    assert d.waw.is_equal(d.raw)  # every write of C is read by the next update, which overwrites it
    assert d.war.is_equal(isl.UnionMap("{ P[i, k, j] -> P[i, k + 1, j] : 0 <= i <= 7 and 0 <= k <= 6 and 0 <= j <= 7 }"))


def test_may_writes_do_not_kill() -> None:
    """A may-write between a write and a read leaves the first write a source of the read."""
    j = scop(
        stmt("W", "{ W[] }", "{ W[] -> [0] }", ("write", "{ W[] -> A[0] }")),
        stmt("M", "{ M[] }", "{ M[] -> [1] }", ("write", "{ M[] -> A[0] }")),
        stmt("R", "{ R[] }", "{ R[] -> [2] }", ("read", "{ R[] -> A[0] }")),
    )
    import islpy as isl

    must = dependences.compute(j)
    may = dependences.compute(j, [["write"], ["may_write"], ["read"]])
    assert must.raw.is_equal(isl.UnionMap("{ M[] -> R[] }"))
    assert may.raw.is_equal(isl.UnionMap("{ W[] -> R[]; M[] -> R[] }"))
