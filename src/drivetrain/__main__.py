"""``python -m drivetrain`` is the ``drivetrain`` command."""

import sys

from drivetrain.cli.main import main

sys.exit(main())
