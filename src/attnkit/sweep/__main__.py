"""``python -m attnkit.sweep SWEEP_DIR``: one worker process of the sweep in SWEEP_DIR (the sweep starts these)."""

import sys

from attnkit.sweep.worker import main

sys.exit(main())
