import sys

from arco.cli import main

sys.exit(main())
