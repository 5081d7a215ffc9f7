"""`python -m blockviz` runs the command line."""

import sys

from blockviz.cli import main

if __name__ == "__main__":
    sys.exit(main())
