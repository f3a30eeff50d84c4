"""``python -m study.train --model NAME --dataset NAME [--set key=value ...]``: see :mod:`study.train.trainer`."""

import sys


def _run() -> int:
    # the first line comes before torch is imported, which takes seconds on a busy machine (--help stays clean)
    if not {"-h", "--help"} & set(sys.argv[1:]):
        print("study.train: loading torch, then preparing the dataset and training", file=sys.stderr, flush=True)
    from study.train.cli import main

    return main()


sys.exit(_run())
