"""``python -m study.train --model NAME --dataset NAME [--set key=value ...]``: see :mod:`study.train.trainer`."""

import sys

from study.train.trainer import main

sys.exit(main())
