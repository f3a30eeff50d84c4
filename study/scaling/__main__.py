"""``python -m study.scaling STUDY.yaml``: see :mod:`study.scaling.core`."""

import sys

# Imported by its package path, not run as __main__: Ray pickles the cell runner by reference, so workers must
# find it under its importable name.
from study.scaling.core import main

sys.exit(main())
