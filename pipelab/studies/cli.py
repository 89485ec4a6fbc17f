"""The studies' command line: ``python -m pipelab figures | data | strip-notebooks`` (:mod:`pipelab.studies.cli`)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import environment
from .config import PRESETS


def measured_in(names: list[str], out: str | Path) -> list[str]:
    """The figures of ``names`` that plot measured wall-clock times (``register(measured=True)``) and are already
    drawn in ``out`` (their sidecar is there)."""
    from . import figures

    return [n for n in names if figures.get(n).measured and (Path(out) / f"{n}.json").exists()]


def _figures(args: argparse.Namespace) -> int:
    from . import figures

    if args.list:
        for spec in figures.available():
            print(f"{spec.name:32s} {spec.module.rsplit('.', 1)[-1]:20s} {spec.description}")
        return 0
    if args.preset is None:
        args.preset = environment.preset()
    from .runner import default_workers, run_figures

    if args.workers is None:  # $PIPELAB_WORKERS when set (checked by environment.check), else one per core
        args.workers = environment.workers() if os.environ.get(environment.WORKERS) else default_workers()
    if args.workers < 1:
        print(f"error: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    if args.stack is not None:
        if args.stack < 1:
            print(f"error: --stack must be an integer >= 1 (1: every run alone), got {args.stack}", file=sys.stderr)
            return 2
        os.environ[environment.STACK] = str(args.stack)  # every learning-curve sweep (learning_curves.stack_cap)
    if args.cached:
        os.environ[environment.CACHED] = "1"  # every sweep (cache.run_sweep) and the device check below
    if args.device is not None:
        try:  # before any experiment runs: "cuda" without CUDA is said plainly, with what to pass instead
            device = environment.named_device(args.device, "--device")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        os.environ[environment.DEVICE] = str(device)  # every figure config's device (config.from_preset)
    if args.out is None:
        args.out = "figures/study" if args.preset == "study" else "figures"
    if args.names:
        names = args.names
    elif args.preset == "study":
        from .figures.study import STUDY_FIGURES

        names = list(STUDY_FIGURES)
    else:
        names = [s.name for s in figures.available() if s.runs_under(args.preset)]
    if not args.names and args.preset != "study" and not args.remeasure:  # measured times differ each run: keep
        kept = measured_in(names, args.out)
        if kept:
            print(f"kept {len(kept)} measured figure(s) already in {args.out} ({', '.join(kept)}): --remeasure or "
                  "their names draw them again", file=sys.stderr)
            names = [n for n in names if n not in kept]
    try:
        specs = [figures.get(n) for n in names]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # before any experiment runs: provenance of figures written into the repository's figures/
        figures.check_outdir(args.out, allow_dirty=args.allow_dirty)
    except (figures.ProvenanceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run_figures([s.name for s in specs], args.preset, args.out, workers=args.workers,
                       allow_dirty=args.allow_dirty)


def _apt_install(deadline: float, packages: tuple[str, ...] = ("dataset-fashion-mnist",)) -> str | None:
    """Install Debian ``packages`` with apt-get as root, before ``deadline``; the problem or None."""
    apt = shutil.which("apt-get")
    names = " ".join(packages)
    if not apt or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return f"apt-get unavailable or not running as root: skipped Debian's {names}"
    logging.getLogger("pipelab").info("installing Debian packages %s", names)
    for cmd in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", *packages]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return f"`{' '.join(cmd)}` not started: the --timeout deadline had passed"
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=remaining, check=False,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        except subprocess.TimeoutExpired:
            return f"`{' '.join(cmd)}` did not finish before the --timeout deadline"
        except OSError as exc:
            return f"`{' '.join(cmd)}` could not run: {exc}"
        if proc.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-300:]}"
    return None


def _data(args: argparse.Namespace) -> int:
    """Verify Fashion-MNIST (every file read in full); with --fetch obtain it first when missing or damaged.

    The word lists of the ``wordlang`` task are checked too (and, with --fetch, installed in the same apt-get
    call); missing ones only warn, since that task alone needs them.
    """
    from .data import DataError, fetch_fashion_mnist, missing_wordlist_packages, verify_fashion_mnist

    if not args.timeout > 0:
        print(f"error: --timeout must be a positive number of seconds, got {args.timeout}", file=sys.stderr)
        return 2
    words_missing = tuple(missing_wordlist_packages())
    apt_tried = False
    try:
        where = verify_fashion_mnist(args.root)
    except DataError as exc:
        if not args.fetch:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        deadline = time.monotonic() + args.timeout
        problem = _apt_install(deadline, ("dataset-fashion-mnist", *words_missing))
        apt_tried = True
        try:
            if problem is None:
                where = verify_fashion_mnist(args.root)
            else:
                raise DataError(problem)
        except DataError as apt_exc:
            try:
                where = fetch_fashion_mnist(args.root, timeout=max(deadline - time.monotonic(), 1e-3))
            except DataError as fetch_exc:
                print(f"error: {apt_exc}\n{fetch_exc}", file=sys.stderr)
                return 1
    print(f"Fashion-MNIST: {where} (verified)")
    if args.fetch and words_missing and not apt_tried:
        problem = _apt_install(time.monotonic() + args.timeout, words_missing)
        if problem is not None:
            print(f"warning: {problem}", file=sys.stderr)
    _report_wordlists()
    return 0


def _report_wordlists() -> None:
    """Print where the word lists are (read in full), or warn how to install the missing ones."""
    from .data import DataError, verify_wordlists

    try:
        print(f"word lists: {verify_wordlists()} (verified)")
    except DataError as exc:
        print(f"warning: only the wordlang task needs them: {exc}", file=sys.stderr)


def _strip(args: argparse.Namespace) -> int:
    from .notebook_tools import strip_notebook

    paths = [p for arg in args.paths
             for p in (sorted(Path(arg).glob("*.ipynb")) if Path(arg).is_dir() else [Path(arg)])]
    for path in paths:
        if strip_notebook(path):
            print(f"stripped {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelab", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("figures", help="regenerate figures (all registered ones by default)")
    p.add_argument("names", nargs="*", metavar="NAME", help="figure names (see --list)")
    p.add_argument("--preset", default=None, choices=PRESETS,
                   help=f"experiment size (default: ${environment.PRESET}, else quick)")
    p.add_argument("--out", default=None,
                   help="output directory (default: figures/, and figures/study/ for the study preset)")
    p.add_argument("--workers", type=int, default=None,
                   help=f"processes drawing figures side by side, one thread each (default: ${environment.WORKERS}, "
                        "else one per CPU core); figures that need the same runs share them")
    p.add_argument("--stack", type=int, default=None, metavar="N",
                   help="train at most N seeds of one arm as one stacked run in every learning-curve sweep, tuning "
                        "included (1: every run alone; the results do not change, a stacked run takes about N times "
                        f"one seed's time and is lost whole when killed; default: ${environment.STACK}, else each "
                        "task's cap in its preset, else 8)")
    p.add_argument("--device", default=None,
                   help="run the experiments on cpu, cuda, cuda:N or auto (CUDA when present); sets the device of "
                        "every figure's config, so the cache and the sidecars record it (default: "
                        f"${environment.DEVICE}, else each preset's)")
    p.add_argument("--cached", action="store_true",
                   help="draw from the result cache only: a run not there is an error naming it (nothing is "
                        "computed), and --device may name a device this machine lacks, the one the runs were "
                        f"computed on (default: ${environment.CACHED}=1)")
    p.add_argument("--list", action="store_true", help="list registered figures and exit")
    p.add_argument("--remeasure", action="store_true",
                   help="also redraw the figures of measured wall-clock times that are already in --out (without "
                        "it, a run of the whole preset keeps them: their times differ on every run)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write into the repository's figures/ although code outside it has uncommitted changes "
                        "(warns; the sidecars record code_clean=false and a hash of the diff)")
    p.set_defaults(func=_figures)

    p = sub.add_parser("data", help="locate and verify (with --fetch: obtain) Fashion-MNIST and the word lists")
    p.add_argument("--fetch", action="store_true", help="install/download it when missing or damaged")
    p.add_argument("--root", default=None,
                   help=f"directory to look in / download to (default: ${environment.DATA}, else the system's)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="overall deadline in seconds for --fetch, retries included (default: 300)")
    p.set_defaults(func=_data)

    p = sub.add_parser("strip-notebooks", help="remove outputs from notebooks before committing")
    p.add_argument("paths", nargs="+", help="notebooks or directories of notebooks")
    p.set_defaults(func=_strip)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:  # before any work: a variable set to a value pipelab cannot use is refused, never silently replaced
        environment.check()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
