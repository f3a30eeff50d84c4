"""``python -m study.campaign CAMPAIGN.yaml``: see :mod:`study.campaign.command`."""

import sys

from study.campaign.command import main

sys.exit(main())
