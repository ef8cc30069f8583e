"""The tables ``edgeinfer bench`` prints (rich), from the reports of ``edgeinfer.cli.bench``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from edgeinfer.cli.bench import NATIVE_ATOL, NATIVE_RTOL, LatencyReport, StreamReport, peer_ratios
from edgeinfer.cli.peers import ORIGINAL

MIB = 1024 * 1024


def console() -> Console:
    """stdout; a terminal gets its own width, a pipe or file wide rows that never wrap."""
    plain = Console()
    return plain if plain.is_terminal else Console(width=220, no_color=True, highlight=False)


COLUMNS = {  # heading -> cell of a report
    "compile s": lambda r: f"{r.compile_s:.3f}",
    "first ms": lambda r: f"{r.first_run_ms:.2f}",
    "min ms": lambda r: f"{r.ms['min']:.3f}",
    "median ms": lambda r: f"{r.ms['median']:.3f}",
    "p90 ms": lambda r: f"{r.ms['p90']:.3f}",
    "p99 ms": lambda r: f"{r.ms['p99']:.3f}",
    "max ms": lambda r: f"{r.ms['max']:.3f}",
    "req/s": lambda r: f"{r.throughput:.1f}",
    "peak RSS MiB": lambda r: "-" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / MIB:.1f}",
}
COMPACT = ("median ms", "p90 ms", "req/s", "RSS MiB")  # "RSS MiB" is "peak RSS MiB"
VS_NATIVE = "vs original"  # the column of median over the original file's on its native engine


def latency_table(reports: Sequence[LatencyReport], failed: Mapping[str, str] | None = None, *,
                  width: int = 220) -> Table:
    """Every column when they fit ``width`` without folding a cell; otherwise the compact table
    (contender, median, p90, req/s, peak RSS, vs best), which fits 80 columns. Where the original
    file ran on its native engine, both end with "vs original": each median over its median. A
    backend in ``failed`` gets a row saying so (its reason is printed under the table,
    ``failure_lines``)."""
    full = _latency_table(reports, failed, tuple(COLUMNS), compact=False)  # + "int8 path" where some has one
    if Console(width=10_000).measure(full).maximum <= width:  # its natural width, nothing folded
        return full
    return _latency_table(reports, failed, COMPACT, compact=True)


def _latency_table(reports: Sequence[LatencyReport], failed: Mapping[str, str] | None, names: Sequence[str], *,
                   compact: bool) -> Table:
    best = min((r.ms["median"] for r in reports), default=float("nan"))
    integer = not compact and any(r.integer_paths for r in reports)  # compact: integer_lines() under it
    native = any(r.native for r in reports)
    # compact: one space between columns and "vs original" over two lines, so that with it the
    # contender's name still gets about 20 of the 80 columns
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0)) if compact else \
        Table(box=box.HEAVY_HEAD)
    table.add_column("contender", style="bold", overflow="fold")
    ratios = ("vs best", VS_NATIVE.replace(" ", "\n") if compact else VS_NATIVE) if native else ("vs best",)
    for name in (*names, *ratios):
        table.add_column(name, justify="right", no_wrap=True)
    if integer:
        table.add_column("int8 path", justify="left")
    reduced = not compact and any(r.compute_precision != "fp32" for r in reports)  # compact: precision_lines()
    if reduced:
        table.add_column("precision", justify="left")
    cells = {**COLUMNS, "RSS MiB": COLUMNS["peak RSS MiB"]}
    for r in reports:
        ratio = r.ms["median"] / best
        versus = (("1.00x" if r.native else f"{r.vs_native:.2f}x"),) if native else ()
        paths = (_integer_cell(r.integer_paths),) if integer else ()
        table.add_row(r.label, *(cells[name](r) for name in names), "best" if ratio == 1 else f"{ratio:.2f}x",
                      *versus, *paths, *((precision_cell(r),) if reduced else ()),
                      style=("bold" if r.native else "dim") if r.peer else None)
    for label in failed or {}:
        table.add_row(label, "failed", *["-"] * (len(names) + len(ratios) - 1), style="red")
    return table


def _integer_cell(paths: Sequence[str]) -> str:
    """One path when every part takes the same one, else each part's."""
    notes = {path.split(": ", 1)[1] for path in paths}
    if not paths:
        return "-"
    return notes.pop().removeprefix("int8 ") if len(notes) == 1 else "; ".join(paths)


def integer_lines(reports: Sequence[LatencyReport], table: Table) -> list[str]:
    """The int8 path of each contender that has one, for a table without that column."""
    if any(column.header == "int8 path" for column in table.columns):
        return []
    return [f"{r.label}: int8 {_integer_cell(r.integer_paths)}" for r in reports if r.integer_paths]


def precision_cell(report: LatencyReport) -> str:
    """The precision and, where not fp32, the worst output's SQNR against fp32."""
    errors = report.precision_error or {}
    if report.compute_precision == "fp32" or not errors:
        return report.compute_precision
    worst = min(errors.values(), key=lambda e: float("inf") if e["sqnr_db"] is None else e["sqnr_db"])
    db = "exact" if worst["sqnr_db"] is None else f"{worst['sqnr_db']:.1f} dB"
    return f"{report.compute_precision} ({db}, max {worst['max_error']:.2%})"


def precision_lines(reports: Sequence[LatencyReport], table: Table) -> list[str]:
    """The precision of each contender not in fp32, for a table without that column."""
    if any(column.header == "precision" for column in table.columns):
        return []
    return [f"{r.label}: precision {precision_cell(r)} vs fp32" for r in reports if r.compute_precision != "fp32"]


def failure_lines(failed: Mapping[str, str], reports: Sequence[LatencyReport] = ()) -> list[str]:
    """Each failed contender's reason, then each one whose nodes partly or wholly run on a backend
    it did not name (its plan, in --json, says why)."""
    lines = [f"{label} failed: {reason}" for label, reason in failed.items()]
    for r in reports:
        if r.elsewhere:
            where = ", ".join(f"{count} on {backend}" for backend, count in r.elsewhere.items())
            lines.append(f"{r.label}: {where} of its {r.nodes} nodes (fallbacks or re-partitioned; see its plan)")
    return lines


def profile_tables(reports: Sequence[LatencyReport], top: int) -> list[tuple[str, Table, str]]:
    """(heading, table, footnote) per contender that has a profile."""
    tables = []
    for r in reports:
        if r.profile is None or not r.profile.rows or top <= 0:
            continue
        what = "ops" if r.profile.kind == "op" else "parts"
        heading = (f"{r.label}: slowest {min(top, len(r.profile.rows))} {what} of {len(r.profile.rows)} "
                   f"({r.profile.total_ms:.3f} ms per run, untimed profile)")
        table = Table()
        table.add_column("ms", justify="right")
        table.add_column("share", justify="right")
        table.add_column("node" if r.profile.kind == "op" else "part")
        for row in r.profile.top(top):
            table.add_row(f"{row.ms:.3f}", f"{row.share:.1%}", row.label)
        footnote = ""
        if r.profile.kind == "op":
            footnote = "by op type: " + ", ".join(f"{op} {ms:.2f} ms" for op, ms in list(r.profile.by_op.items())[:6])
        tables.append((heading, table, footnote))
    return tables


PEER_HEADING = "median latency over the raw engine's, same process, interleaved (above 1: edgeinfer slower)"


def peer_table(reports: Sequence[LatencyReport]) -> Table | None:
    ratios = peer_ratios(reports)
    peers = [r for r in reports if r.peer]
    if not peers or not ratios:
        return None
    table = Table()
    table.add_column("edgeinfer", style="bold")
    for p in peers:  # the original file's path is in peer_lines, its heading says what it is
        table.add_column(p.backend if p.native else f"{p.backend}\n({p.runs_on})", justify="right")
    for name, row in ratios.items():
        table.add_row(name, *(f"{row[p.backend]:.2f}x" for p in peers))
    return table


def peer_lines(reports: Sequence[LatencyReport], skipped: Mapping[str, str]) -> list[str]:
    """What the original file's row ran and how each edgeinfer contender's outputs compare with
    its outputs (or, in one line, why there is no such row), then the peers skipped."""
    lines = []
    base = next((r for r in reports if r.native), None)
    if base is not None:
        lines.append(f"{base.backend}: {base.runs_on}")
        checks = [(r.label, r.native_check) for r in reports if r.native_check is not None]
        if checks:
            lines.append(f"outputs against the {ORIGINAL}'s (tolerance {NATIVE_RTOL:g} x its largest + {NATIVE_ATOL:g}): "
                         + "; ".join(_check_cell(label, check) for label, check in checks))
    elif ORIGINAL in skipped:
        lines.append(skipped[ORIGINAL])
    others = {k: v for k, v in skipped.items() if k != ORIGINAL}
    if others:
        lines.append("peers skipped: " + "; ".join(f"{k}: {v}" for k, v in others.items()))
    return lines


def _check_cell(label: str, check: Mapping) -> str:
    if check.get("note"):
        return f"{label} DIFFERS ({check['note']})"
    error = "NaN" if check["max_abs_error"] is None else f"{check['max_abs_error']:.2g}"
    if check["within_tolerance"]:
        return f"{label} max error {error}"
    return f"{label} DIFFERS: max error {error} on {check['output']!r} > {check['tolerance']:.2g}"


def stream_lines(report: StreamReport) -> list[str]:
    where = "Ray actors" if report.executor == "ray" else "local threads"
    return [f"stream of {report.requests} requests on {report.backend}, stages on {where} "
            f"(planned in {report.planning_s:.2f} s):",
            report.plan,
            f"throughput: pipeline {report.stream_per_s:.1f} req/s, one after another "
            f"{report.sequential_per_s:.1f} req/s ({report.speedup:.2f}x)"]
