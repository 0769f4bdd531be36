"""``python -m ddptop``."""

import sys

from ddptop.cli.main import main

sys.exit(main())
