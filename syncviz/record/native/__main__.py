"""``python -m syncviz.record.native``: build the C++ gradient-ready hooks now (make install does)."""
import sys

from syncviz.record.native import main

sys.exit(main())
