"""``python3 -m omnipd_stage``: see cli.py."""

import sys

from .cli import main

sys.exit(main())
