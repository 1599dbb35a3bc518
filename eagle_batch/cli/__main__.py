"""`python -m eagle_batch.cli ...`: the same as `eagle-batch ...`."""

import sys

from eagle_batch.cli import main

sys.exit(main())
