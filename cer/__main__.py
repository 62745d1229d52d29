import sys

from cer.cli import main

sys.exit(main())
