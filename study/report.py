"""``python -m study.report RESULTS_DIR [RESULTS_DIR ...]``: see :mod:`study.analysis.document`."""

import sys

from study.analysis.document import main

if __name__ == "__main__":
    sys.exit(main())
