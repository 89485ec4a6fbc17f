"""`make figures` against its budget: per-figure seconds, CPU seconds and the total, against ten minutes.

Runs ``python -m pipelab figures --preset PRESET`` (default ``quick``) with an empty result cache (a temporary one
unless ``--cache`` names one: a directory given again resumes where a stopped run ended, so runs of at most ten
minutes can be stitched) into a temporary output directory (or ``--out``), then prints, from the run's
``timings.csv`` (:mod:`pipelab.studies.runner`), each figure's wall and CPU seconds beside its declared budget, the
run's wall time against :data:`TARGET_S` and the sum of the CPU seconds (which other programs on a shared machine
inflate much less than wall time; on an idle 2-core machine the wall time is about half of it). ``--report`` prints
the table of an existing ``timings.csv`` without running anything.

Usage:
    .venv/bin/python benchmarks/figures.py [--preset quick] [--cache DIR] [--out DIR] [--workers N] [FIGURE ...]
    .venv/bin/python benchmarks/figures.py --report figures/timings.csv [--preset quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/figures.py` finds pipelab

from pipelab.studies import figures  # noqa: E402
from pipelab.studies.runner import TIMINGS, TOTAL, read_timings  # noqa: E402

#: seconds `make figures` (quick, empty cache) may take on an idle 2-core CPU (issue 25)
TARGET_S = 600.0


def report(path: Path, preset: str) -> str:
    """The table of ``path`` (a ``timings.csv``) for ``preset``: figures slowest first, then the total."""
    rows = [r for r in read_timings(path) if r.get("preset") == preset]
    total = next((r for r in rows if r["figure"] == TOTAL), None)
    rows = sorted((r for r in rows if r["figure"] != TOTAL), key=lambda r: -float(r["seconds"]))
    lines = [f"{'figure':34s} {'seconds':>8s} {'CPU s':>8s} {'budget':>7s} {'load':>6s}"]
    for r in rows:
        budget = figures.get(r["figure"]).budget(preset) if r["figure"] in _names() else None
        flag = "  over 1.5x budget" if budget is not None and float(r["seconds"]) > 1.5 * budget else ""
        lines.append(f"{r['figure']:34s} {float(r['seconds']):8.1f} {_float(r.get('cpu_seconds')):8.1f} "
                     f"{'-' if budget is None else f'{budget:g}':>7s} {r.get('load_1m', ''):>6s}{flag}")
    cpu = sum(_float(r.get("cpu_seconds")) for r in rows)
    lines.append(f"{len(rows)} figures; sum of CPU seconds {cpu:.0f} s (about {cpu / 2:.0f} s of wall time on an idle "
                 "2-core CPU)")
    if total is not None:
        wall = float(total["seconds"])
        verdict = "within" if wall <= TARGET_S else "OVER"
        lines.append(f"total wall time {wall:.0f} s ({verdict} the {TARGET_S:.0f} s budget; load average at the end "
                     f"{total.get('load_1m', '?')}, {total.get('workers', '?')} worker(s), commit "
                     f"{total.get('commit', '?')})")
    return "\n".join(lines)


def _names() -> set[str]:
    return {s.name for s in figures.available()}


def _float(text: str | None) -> float:
    try:
        return float(text or "nan")
    except ValueError:
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="figures to draw (default: every figure of the preset)")
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--cache", default=None, help="result cache directory (default: a new empty one)")
    ap.add_argument("--out", default=None, help="output directory (default: a new temporary one)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--report", type=Path, default=None, help="only print the table of this timings.csv")
    args = ap.parse_args(argv)
    if args.report is not None:
        print(report(args.report, args.preset))
        return 0
    with tempfile.TemporaryDirectory(prefix="pipelab-figures-bench-") as tmp:
        cache = args.cache or os.path.join(tmp, "cache")
        out = Path(args.out or os.path.join(tmp, "out"))
        cmd = [sys.executable, "-m", "pipelab", "figures", "--preset", args.preset, "--out", str(out),
               "--allow-dirty", *args.names]
        if args.workers is not None:
            cmd += ["--workers", str(args.workers)]
        status = subprocess.call(cmd, env={**os.environ, "PIPELAB_CACHE": cache, "MPLBACKEND": "Agg"},
                                 cwd=Path(__file__).resolve().parents[1])
        print(report(out / TIMINGS, args.preset))
    return status


if __name__ == "__main__":
    sys.exit(main())
