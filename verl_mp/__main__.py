import sys

from verl_mp.cli import main

sys.exit(main())
