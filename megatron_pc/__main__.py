"""``python -m megatron_pc`` is the ``megatron-pc`` command."""

import sys

from megatron_pc.cli import main

sys.exit(main())
