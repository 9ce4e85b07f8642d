"""`python -m services.cli` is the `rackscale` command."""

import sys

from services.cli.main import main

sys.exit(main())
