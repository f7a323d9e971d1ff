"""``python -m kvlib``: runs :func:`kvlib.cli.main` and exits with its status."""

import sys

from kvlib.cli import main

sys.exit(main())
