"""tests/ mirrors the code: topology/, agent/ (topology/agent/), extender/<package>/, replay/ (loadtests/replay/),
loadtests/, manifests/ (scheduler-config/, its chart/, and the Dockerfile), e2e/, docs/ (the documents a user reads);
what several suites share is in helpers/.

tests/ goes on the path for `helpers`, and the checkout with it: otherwise, where an editable install's finder is all
that provides topology, extender and loadtests, tests/'s folders of those names would be found first, as namespace
packages. The test folders have no __init__.py (as packages they would shadow the code they test), so pytest imports
each test module by its file's name, and a test file's name is unique in the whole tree.
"""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS), str(TESTS.parent)]
