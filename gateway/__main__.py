"""python -m gateway: the same as the `toolspan` command."""

import sys

from gateway.cli import main

sys.exit(main())
