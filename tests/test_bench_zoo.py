"""benchmarks/bench_zoo.py: the JSON holds every figure and the markdown page is made from it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("bench_zoo", ROOT / "benchmarks" / "bench_zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_zoo_script_writes_json_and_a_page_made_from_it(tmp_path, monkeypatch):
    script = load_script()
    out, page = tmp_path / "zoo.json", tmp_path / "perf.md"
    script.main(["--models", "mlp", "--backends", "numpy", "onnxruntime", "nosuchengine", "--runs", "2",
                 "--warmup", "0", "--json", str(out), "--markdown", str(page)])
    document = json.loads(out.read_text())
    assert document["machine"]["versions"]["edgeinfer"] and document["backends"] == ["numpy", "onnxruntime",
                                                                                      "nosuchengine"]
    rows = {(r["model"], r["precision"], r["backend"]): r for r in document["results"]}
    assert set(rows) == {("mlp", p, b) for p in ("fp32", "int8") for b in ("numpy", "onnxruntime", "nosuchengine")}
    assert "unknown backend" in rows[("mlp", "fp32", "nosuchengine")]["error"]
    text = page.read_text()
    title = script.MODELS["mlp"][0]
    for precision in ("fp32", "int8"):
        [line] = [row for row in text.splitlines() if row.startswith(f"| {title} | {precision} |")]
        cells = [c.strip() for c in line.strip("|").split("|")]
        for backend, cell in zip(document["backends"], cells[2:]):
            row = rows[("mlp", precision, backend)]
            if "error" in row:
                assert cell == "-"
            else:
                assert cell.startswith(f"{row['ms']['median']:.2f} ({row['ms']['p90']:.2f})")
    # the page is a pure function of the JSON: re-rendering it measures nothing and changes nothing
    again = tmp_path / "again.md"
    monkeypatch.setattr(script.bench, "latency", None)  # would fail if called
    script.main(["--from-json", str(out), "--markdown", str(again)])
    assert again.read_text() == text
