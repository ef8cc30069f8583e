"""Capability-based partitioning: which backend runs each node, and the subgraphs that follow.

1. ``assign``: every node goes to the first backend, in priority order, whose ``claim``
   accepts it; the numpy reference (which runs everything ONNX defines) is always the last
   resort. The reasons the earlier backends gave are kept, so a plan can say why a node fell
   back. A node computing from constants alone (a weight's DequantizeLinear) then follows its
   readers' backend, so that no constant crosses parts.
2. ``group``: nodes on the same backend are merged into subgraphs without creating a cycle
   between subgraphs. Each node gets a level, at least its same-backend producers' level and
   above its other producers' level (the earliest such, then raised towards its consumers as
   far as that allows); every edge between two groups then goes from a lower level to a
   higher one (or stays inside one backend's level), so the groups (backend, level) form a DAG.
   This is linear in the graph (a 5,000-node graph with 2,500 alternations partitions in well
   under a second: benchmarks/bench_runtime.py). While few groups remain, any two groups of one
   backend are then merged while no path links them other than a direct edge (so the merge
   keeps the DAG acyclic): the parts are maximal.
3. ``split_branches`` (for the DAG-parallel executor): each subgraph is cut further at forks
   and joins into chains, so independent branches become separate parts that can run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from edgeinfer.backend import Backend, part_note
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph


class Assignment:
    """node index (in graph order) -> backend name, and why earlier backends declined. Plain
    classes here (a device's cold start imports this module and no ``dataclasses``)."""

    __slots__ = ("backends", "declined")

    def __init__(self, backends: list[str], declined: dict[int, dict[str, str]] | None = None) -> None:
        self.backends = backends
        self.declined: dict[int, dict[str, str]] = {} if declined is None else declined  # index -> {backend: reason}

    def __repr__(self) -> str:
        return f"Assignment(backends={self.backends!r}, declined={self.declined!r})"


class Part:
    """A self-contained subgraph placed on one backend."""

    __slots__ = ("backend", "nodes", "graph")

    def __init__(self, backend: str, nodes: list[int], graph: Graph) -> None:
        self.backend = backend
        self.nodes = nodes  # indices into the partitioned graph's nodes, in graph order
        self.graph = graph

    def __repr__(self) -> str:
        return f"Part(backend={self.backend!r}, nodes={self.nodes!r})"

    @property
    def inputs(self) -> list[str]:
        return self.graph.input_names

    @property
    def outputs(self) -> list[str]:
        return self.graph.output_names


def assign(graph: Graph, backends: Sequence[Backend], *, pinned: Mapping[int, str] | None = None,
           excluded: Mapping[int, Mapping[str, str]] | None = None, prior: Sequence[str] | None = None) -> Assignment:
    """Place every node on the first backend of ``backends`` that claims it (``Backend.claim``).

    ``pinned`` (node index -> backend name) forces placements, e.g. to test every placement;
    a pinned backend that cannot run its node is a ``BackendError``. ``excluded`` (node index
    -> {backend name: reason}) keeps nodes off backends that accepted them but then failed to
    compile or run them (the runtime's re-partition); the reason is kept like a decline. A
    pinned node barred from its backend is placed as an unpinned one. ``prior`` (the backend of
    every node, decided ahead of time: a compiled ``.eim``) places each node on its backend
    without asking any claim, where that backend is among ``backends`` and the node is not
    barred from it; the others are placed as usual.
    """
    if prior is not None and len(prior) != len(graph.nodes):
        raise BackendError(f"a prior placement of {len(prior)} node(s) for graph {graph.name!r} of "
                           f"{len(graph.nodes)}: expected one backend per node")
    excluded = excluded or {}
    by_name = {b.name: b for b in backends}
    claims: dict[str, dict[int, str]] = {}  # backend -> what it does not take (``Backend.claim``), asked once

    def refused(name: str, index: int) -> str | None:
        if name not in claims:
            claims[name] = by_name[name].claim(graph)
        return claims[name].get(index)

    placed: list[str] = []
    declined: dict[int, dict[str, str]] = {}
    held: set[int] = set()
    for index, node in enumerate(graph.nodes):
        if prior is not None and prior[index] in by_name and prior[index] not in excluded.get(index, {}):
            placed.append(prior[index])
            held.add(index)
            continue
        if pinned and index in pinned and pinned[index] not in excluded.get(index, {}):
            name = pinned[index]
            if name not in by_name:
                raise BackendError(f"{node.label} pinned to backend {name!r}, which is not among "
                                   f"{list(by_name)}")
            reason = refused(name, index)
            if reason is not None:
                raise BackendError(f"{node.label} pinned to backend {name!r}, which cannot run it: {reason}")
            placed.append(name)
            continue
        reasons: dict[str, str] = {}
        barred = excluded.get(index, {})
        for backend in backends:
            reason = barred.get(backend.name) or refused(backend.name, index)
            if reason is None:
                placed.append(backend.name)
                break
            reasons[backend.name] = reason
        else:
            listed = "; ".join(f"{name}: {why}" for name, why in reasons.items())
            raise BackendError(f"no backend can run {node.label}: {listed}")
        if reasons:
            declined[index] = reasons
    held |= {i for i, name in (pinned or {}).items() if name not in excluded.get(i, {})}
    _follow_consumers(graph, refused, placed, held, excluded)
    return Assignment(placed, declined)


def _follow_consumers(graph: Graph, refused: Callable[[str, int], str | None], placed: list[str], pinned: set[int],
                      excluded: Mapping[int, Mapping[str, str]]) -> None:
    """A node that reads only constants (a weight's DequantizeLinear, a Cast or Transpose of one)
    moves to the backend of its readers when they all sit on one that runs it: placed apart from
    them its output would be a constant crossing parts, which an engine that computes every
    output (TFLite) cannot compile, and its readers would lose a constant weight. Reverse graph
    order, so a chain of such nodes follows its last reader."""
    computed = {id(node) for node in graph.computed_from_constants().values()}
    followers = [index for index, node in enumerate(graph.nodes) if id(node) in computed]
    if not followers:
        return
    readers = _readers(graph)
    outputs = set(graph.output_names)
    for index in reversed(followers):
        node = graph.nodes[index]
        if index in pinned or any(name in outputs for name in node.outputs):
            continue
        targets = {placed[reader] for name in node.outputs if name for reader in readers.get(name, ())}
        if len(targets) != 1:
            continue
        target = targets.pop()
        if target != placed[index] and target not in excluded.get(index, {}) \
                and refused(target, index) is None:
            placed[index] = target


def _edges(graph: Graph) -> tuple[list[set[int]], list[set[int]]]:
    """Producer -> consumer edges between node indices (outer-scope reads of subgraphs too)."""
    producer = {o: i for i, node in enumerate(graph.nodes) for o in node.outputs if o}
    preds: list[set[int]] = [set() for _ in graph.nodes]
    succs: list[set[int]] = [set() for _ in graph.nodes]
    for index, node in enumerate(graph.nodes):
        reads = [i for i in node.inputs if i]
        for sub in node.subgraphs():
            reads.extend(sub.outer_names())
        for name in reads:
            source = producer.get(name)
            if source is not None and source != index:
                preds[index].add(source)
                succs[source].add(index)
    return preds, succs


def _readers(graph: Graph) -> dict[str, list[int]]:
    """value name -> indices of the nodes that read it (graph inputs and constants included)."""
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for name in dict.fromkeys(i for i in node.inputs if i):
            readers.setdefault(name, []).append(index)
    return readers


CONTRACT_LIMIT = 64  # groups up to which the exact (quadratic) merge pass runs after the level pass


def levels(placed: Sequence[str], preds: list[set[int]], succs: list[set[int]]) -> list[int]:
    """A level per node such that every edge p -> i has ``level[i] >= level[p]``, plus one when
    the two are on different backends: the earliest such levels, then each node raised as far
    towards its consumers as that allows (a node feeding only later same-backend work joins it)."""
    count = len(placed)
    level = [0] * count
    for index in range(count):  # graph.nodes is topologically sorted
        level[index] = max((level[p] + (placed[p] != placed[index]) for p in preds[index]), default=0)
    for index in reversed(range(count)):
        if succs[index]:
            late = min(level[s] - (placed[s] != placed[index]) for s in succs[index])
            if late > level[index]:
                level[index] = late
    return level


def group(graph: Graph, assignment: Assignment) -> list[Part]:
    """Maximal cycle-free subgraphs of same-backend nodes, in a topological order.

    Every (backend, level) class is one group: an edge between two groups goes from a lower
    level to a higher one or stays inside one backend's level, so no merge of a class closes a
    cycle (a path leaving a class through another backend cannot come back to its level). This
    is linear in the graph. When few groups remain, an exact pass merges any two of one backend
    that no path through a third part links (``_contract``)."""
    placed = assignment.backends
    preds, succs = _edges(graph)
    level = levels(placed, preds, succs)
    first_of: dict[tuple[str, int], int] = {}
    members = [first_of.setdefault((placed[i], level[i]), i) for i in range(len(graph.nodes))]
    if len(first_of) <= CONTRACT_LIMIT:
        members = _contract(placed, preds, succs, members)
    return _parts(graph, placed, members, preds)


def _contract(placed: list[str], preds: list[set[int]], succs: list[set[int]], members: list[int]) -> list[int]:
    """Merge groups of one backend while some pair has no path between them other than a direct
    edge (merging such a pair cannot close a cycle); pairs joined by an edge go first."""
    backend_of = {m: placed[i] for i, m in enumerate(members)}
    while True:
        group_succs: dict[int, set[int]] = {}
        for index, targets in enumerate(succs):
            for target in targets:
                a, b = members[index], members[target]
                if a != b:
                    group_succs.setdefault(a, set()).add(b)
        groups = sorted(set(members))
        adjacent = [(a, b) for a in groups for b in sorted(group_succs.get(a, ())) if backend_of[a] == backend_of[b]]
        independent = [(a, b) for i, a in enumerate(groups) for b in groups[i + 1:]
                       if backend_of[a] == backend_of[b] and b not in group_succs.get(a, ())
                       and a not in group_succs.get(b, ())]
        pair = next(((a, b) for a, b in [*adjacent, *independent]
                     if not _other_path(group_succs, a, b) and not _other_path(group_succs, b, a)), None)
        if pair is None:
            return members
        keep, gone = pair
        members = [keep if m == gone else m for m in members]


def _other_path(group_succs: dict[int, set[int]], a: int, b: int) -> bool:
    """Whether ``b`` is reachable from ``a`` other than by the direct edge a -> b."""
    stack = [s for s in group_succs.get(a, ()) if s != b]
    seen = set(stack)
    while stack:
        current = stack.pop()
        if current == b:
            return True
        for nxt in group_succs.get(current, ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return False


def _parts(graph: Graph, placed: list[str], members: list[int], preds: list[set[int]] | None = None) -> list[Part]:
    """Parts ordered so each comes after every part it reads from (Kahn's algorithm over the
    group graph, the group whose first node comes first taking the lead)."""
    by_group: dict[int, list[int]] = {}
    for index, key in enumerate(members):
        by_group.setdefault(key, []).append(index)
    if preds is None:
        preds, _ = _edges(graph)
    deps = {key: {members[p] for i in nodes for p in preds[i]} - {key} for key, nodes in by_group.items()}
    waiting = {key: len(found) for key, found in deps.items()}
    consumers: dict[int, list[int]] = {}
    for key, found in deps.items():
        for dep in found:
            consumers.setdefault(dep, []).append(key)
    import heapq  # not imported by a compiled file's load

    ready = [(by_group[k][0], k) for k, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    ordered: list[int] = []
    while ready:  # the group graph is acyclic: every group becomes ready
        _, key = heapq.heappop(ready)
        ordered.append(key)
        for consumer in consumers.get(key, ()):
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                heapq.heappush(ready, (by_group[consumer][0], consumer))
    parts = []
    body_readers = graph.body_readers()
    for number, key in enumerate(ordered):
        nodes = by_group[key]
        backend = placed[nodes[0]]
        sub = graph.subgraph([graph.nodes[i] for i in nodes], name=f"{graph.name}_part{number}_{backend}",
                             in_order=True, body_readers=body_readers)  # node indices ascend: graph order
        parts.append(Part(backend, nodes, sub))
    return parts


def split_branches(graph: Graph, parts: list[Part]) -> list[Part]:
    """Cut each part at forks and joins, so that independent branches are separate parts.

    A node continues its producer's chain when it is that producer's only consumer inside the
    part and the producer is its only producer inside the part; otherwise it starts a chain.
    """
    preds, succs = _edges(graph)
    members = list(range(len(graph.nodes)))
    placed = [""] * len(graph.nodes)
    for part in parts:
        inside = set(part.nodes)
        for index in part.nodes:
            placed[index] = part.backend
            mine = preds[index] & inside
            if len(mine) == 1:
                (producer,) = mine
                if len(succs[producer] & inside) == 1:
                    members[index] = members[producer]
    return _parts(graph, placed, members)


def describe(parts: Sequence[Part], assignment: Assignment, graph: Graph) -> str:
    """A human-readable plan: each part with its backend and ops, then every fallback and why."""
    lines = []
    for number, part in enumerate(parts):
        ops: dict[str, int] = {}
        for index in part.nodes:
            node = graph.nodes[index]
            op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            ops[op] = ops.get(op, 0) + 1
        listed = ", ".join(f"{op} x{count}" if count > 1 else op for op, count in ops.items())
        note = part_note(part.backend, part.graph)
        lines.append(f"part {number}: {part.backend:<12} {len(part.nodes):4d} nodes  "
                     f"in {_names(part.inputs)} -> out {_names(part.outputs)}  [{listed}]"
                     + (f"  ({note})" if note else ""))
    if assignment.declined:
        lines.append("fallbacks:")
        for index, reasons in assignment.declined.items():
            node = graph.nodes[index]
            why = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
            lines.append(f"  {node.label} -> {assignment.backends[index]} ({why})")
    return "\n".join(lines)


def _names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}]"

