"""``python -m kubeinfer.operator`` runs the operator (same as ``kubeinfer-operator``)."""

import sys

from .cli import main

sys.exit(main())
