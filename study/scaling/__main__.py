"""``python -m study.scaling STUDY.yaml``: see :mod:`study.scaling.command`."""

import sys

# The command lives in an importable module rather than here: the measuring process and Ray's workers find the
# cell runner by its package path (study.scaling.cells), never as a function of __main__.
from study.scaling.command import main

sys.exit(main())
