"""``python -m polyc``: the command line."""

from polyc.cli import main

raise SystemExit(main())
