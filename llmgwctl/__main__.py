import sys

from llmgwctl.main import main

sys.exit(main())
