"""The tables ``edgeinfer bench`` prints (rich), from the reports of ``edgeinfer.cli.bench``."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from edgeinfer.cli.bench import LatencyReport, StreamReport, peer_ratios

MIB = 1024 * 1024


def console() -> Console:
    """stdout; a terminal gets its own width, a pipe or file wide rows that never wrap."""
    plain = Console()
    return plain if plain.is_terminal else Console(width=220, no_color=True, highlight=False)


def latency_table(reports: Sequence[LatencyReport]) -> Table:
    best = min(r.ms["median"] for r in reports)
    integer = any(r.integer_paths for r in reports)  # a column only where some part has int8 products
    table = Table()
    table.add_column("contender", style="bold")
    for name in ("compile s", "first ms", "min ms", "median ms", "p90 ms", "p99 ms", "max ms", "req/s",
                 "peak RSS MiB", "vs best") + (("int8 path",) if integer else ()):
        table.add_column(name, justify="left" if name == "int8 path" else "right")
    for r in reports:
        memory = "-" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / MIB:.1f}"
        ratio = r.ms["median"] / best
        paths = (_integer_cell(r.integer_paths),) if integer else ()
        table.add_row(r.label, f"{r.compile_s:.3f}", f"{r.first_run_ms:.2f}", f"{r.ms['min']:.3f}",
                      f"{r.ms['median']:.3f}", f"{r.ms['p90']:.3f}", f"{r.ms['p99']:.3f}", f"{r.ms['max']:.3f}",
                      f"{r.throughput:.1f}", memory, "best" if ratio == 1 else f"{ratio:.2f}x", *paths,
                      style="dim" if r.peer else None)
    return table


def _integer_cell(paths: Sequence[str]) -> str:
    """One path when every part takes the same one, else each part's."""
    notes = {path.split(": ", 1)[1] for path in paths}
    if not paths:
        return "-"
    return notes.pop().removeprefix("int8 ") if len(notes) == 1 else "; ".join(paths)


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
    for p in peers:
        table.add_column(f"{p.backend}\n({p.runs_on})", justify="right")
    for name, row in ratios.items():
        table.add_row(name, *(f"{row[p.backend]:.2f}x" for p in peers))
    return table


def stream_lines(report: StreamReport) -> list[str]:
    where = "Ray actors" if report.executor == "ray" else "local threads"
    return [f"stream of {report.requests} requests on {report.backend}, stages on {where} "
            f"(planned in {report.planning_s:.2f} s):",
            report.plan,
            f"throughput: pipeline {report.stream_per_s:.1f} req/s, one after another "
            f"{report.sequential_per_s:.1f} req/s ({report.speedup:.2f}x)"]
