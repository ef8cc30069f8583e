"""How long ``edgeinfer`` takes before it does anything: ``--help`` and one-line errors.

Each command line runs ``--repeat`` times as a fresh process (the installed console script of
this interpreter's environment); the median and the minimum wall time are printed, beside
``python -c pass`` (the interpreter alone) and ``python -c 'import onnx'`` (what the command line
avoids importing until a command needs it). The target is under 0.3 s for ``--help`` and errors.

    python benchmarks/bench_startup.py [--repeat 7] [--json startup.json]

Also prints the slowest imports of ``import edgeinfer.cli`` (``python -X importtime``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command_lines(workdir: Path) -> dict[str, list[str]]:
    script = shutil.which("edgeinfer", path=str(Path(sys.executable).parent)) or "edgeinfer"
    sample = str(ROOT / "models" / "sample_cnn.onnx")
    missing = str(workdir / "absent.onnx")
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import onnx'": [sys.executable, "-c", "import onnx"],
        "edgeinfer --help": [script, "--help"],
        "edgeinfer run --help": [script, "run", "--help"],
        "edgeinfer inspect absent.onnx (error)": [script, "inspect", missing],
        "edgeinfer run absent.onnx (error)": [script, "run", missing, "--random-inputs"],
        "edgeinfer convert sample -o x.txt (error)": [script, "convert", sample, "-o", str(workdir / "x.txt")],
        "edgeinfer bench --stages x (error)": [script, "bench", sample, "--stages", "x"],
    }


def wall_times(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return times


def slowest_imports(top: int = 8) -> list[tuple[str, float]]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import edgeinfer.cli"],
                          capture_output=True, text=True, check=False)
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((parts[2].rstrip(), int(parts[1]) / 1e6))
    return sorted(rows, key=lambda row: -row[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, argv in command_lines(Path(folder)).items():
            times = wall_times(argv, args.repeat)
            results[label] = {"median_s": statistics.median(times), "min_s": min(times)}
            print(f"{label:45s} median {results[label]['median_s']:.3f} s  min {results[label]['min_s']:.3f} s")
    print("slowest imports of `import edgeinfer.cli` (cumulative):")
    for name, seconds in slowest_imports():
        print(f"  {seconds:.3f} s {name}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
