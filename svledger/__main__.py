"""``python -m svledger``: the same as the ``svledger`` command."""

from svledger.cli import main

raise SystemExit(main())
