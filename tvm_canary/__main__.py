"""``python -m tvm_canary``: the ``tvm-canary`` command."""

from .cli import main

raise SystemExit(main())
