"""``python -m jdist``: the ``jdist`` command (:mod:`jdist.cli`)."""

import sys

from jdist.cli import main

sys.exit(main())
