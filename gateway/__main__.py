"""python -m gateway: the same as the `toolspan` command."""

import sys

from gateway.cli.main import main

sys.exit(main())
