import sys

from eagle_batch.cli import main

sys.exit(main())
