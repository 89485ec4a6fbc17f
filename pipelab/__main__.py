"""Command line: ``python -m pipelab figures | data | strip-notebooks``."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from .config import PRESETS


def _figures(args: argparse.Namespace) -> int:
    from . import figures

    if args.list:
        for spec in figures.available():
            print(f"{spec.name:32s} {spec.module.rsplit('.', 1)[-1]:20s} {spec.description}")
        return 0
    names = args.names or [s.name for s in figures.available()]
    try:
        specs = [figures.get(n) for n in names]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # before any experiment runs: provenance of figures written into the repository's figures/
        figures.check_outdir(args.out, allow_dirty=args.allow_dirty)
    except figures.ProvenanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from tqdm import tqdm

    bar = tqdm(specs, desc=f"figures ({args.preset})", unit="fig")
    failed = []
    for spec in bar:
        bar.set_postfix_str(spec.name)
        start = time.perf_counter()
        try:
            figures.render([spec.name], args.preset, args.out, progress=True, allow_dirty=args.allow_dirty)
        except Exception:
            logging.getLogger("pipelab").exception("figure %s failed", spec.name)
            failed.append(spec.name)
            continue
        tqdm.write(f"  {spec.name}: {time.perf_counter() - start:.1f} s -> {Path(args.out) / spec.name}.png")
    if failed:
        print(f"error: {len(failed)} figure(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _data(args: argparse.Namespace) -> int:
    from .data import DataError, fetch_fashion_mnist, find_fashion_mnist

    try:
        where = fetch_fashion_mnist(args.root) if args.fetch else find_fashion_mnist(args.root)["train_images"].parent
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Fashion-MNIST: {where}")
    return 0


def _strip(args: argparse.Namespace) -> int:
    from .notebook_tools import strip_notebook

    paths = [p for arg in args.paths for p in (sorted(Path(arg).glob("*.ipynb")) if Path(arg).is_dir() else [Path(arg)])]
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
    p.add_argument("--preset", default="quick", choices=PRESETS, help="experiment size (default: quick)")
    p.add_argument("--out", default="figures", help="output directory (default: figures/)")
    p.add_argument("--list", action="store_true", help="list registered figures and exit")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write into the repository's figures/ although code outside it has uncommitted changes "
                        "(warns; the sidecars record code_clean=false and a hash of the diff)")
    p.set_defaults(func=_figures)

    p = sub.add_parser("data", help="locate (or with --fetch obtain) Fashion-MNIST")
    p.add_argument("--fetch", action="store_true", help="install/download it when missing")
    p.add_argument("--root", default=None, help="directory to look in / download to")
    p.set_defaults(func=_data)

    p = sub.add_parser("strip-notebooks", help="remove outputs from notebooks before committing")
    p.add_argument("paths", nargs="+", help="notebooks or directories of notebooks")
    p.set_defaults(func=_strip)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
