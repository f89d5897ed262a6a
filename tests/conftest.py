"""tests/ mirrors the code: topology/, agent/ (topology/agent/), extender/<package>/, replay/ (loadtests/replay/),
loadtests/, manifests/ (scheduler-config/ and the Dockerfile), e2e/; what several suites share is in helpers/.

tests/ goes on the path, so `helpers` imports as a package. The test directories have no __init__.py: as packages,
tests/topology/ and tests/extender/ would shadow the code they test. pytest imports each test module by its file's
name, so a test file's name is unique in the whole tree.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
