"""The tests' settings: the development ones, asked for by name, since production is the default.

The environment is changed rather than the module's values, so the servers and
commands that tests start (they inherit the environment) run as the tests do.
"""

import os

os.environ.setdefault("DEBUG", "true")

from llmgw_site.settings import *  # noqa: F403
