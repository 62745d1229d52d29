import sys

from eviback.cli import main

sys.exit(main())
