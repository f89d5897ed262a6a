"""Where the tests find what they read, wherever a test file sits under tests/."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent  # the repository
FIXTURES = TESTS / "fixtures"
CAPTURES = ROOT / "topology" / "captures"  # the bundled `nvidia-smi topo -m` captures
LOADTESTS = ROOT / "loadtests"
SHARED = ROOT.parent / "shared"  # the shared topologies, traces and kube-scheduler bodies beside the repository
