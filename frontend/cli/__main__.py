import sys

from tinyvllm.frontend.cli.main import main

sys.exit(main())
