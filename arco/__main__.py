from arco.cli import main
from common.train.distributed import exit_process

exit_process(main())
