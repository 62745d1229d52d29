from common.train.distributed import exit_process
from eviback.cli import main

exit_process(main())
