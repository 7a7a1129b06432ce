"""``python -m zephon_columnar inspect PATH`` / ``bench PATH ...``: see `zephon_columnar.cli`."""

import sys

from zephon_columnar.cli import main

if __name__ == "__main__":  # not when a test collector imports the module
    sys.exit(main())
