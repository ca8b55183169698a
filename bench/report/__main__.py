"""`python -m bench.report <paths...>`: the same as `membench report`."""
import sys

from bench.report.app import main

if __name__ == "__main__":
    sys.exit(main())
