"""``python -m envhub ...``: the envhub command line (see envhub/cli.py)."""

from envhub.cli import main

raise SystemExit(main())
