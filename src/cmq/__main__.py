import sys

from cmq.cli import main

sys.exit(main())
