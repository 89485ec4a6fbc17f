"""``python -m pipelab figures | data | strip-notebooks``: the studies' command line (:mod:`pipelab.studies.cli`)."""

from .studies.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
