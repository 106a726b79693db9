"""Claude Code for tests/clients: the training example's own episode runner
(agents/claude_code_episode.py), run as it is, inside `unshare -n`."""

import runpy
import sys
from pathlib import Path

AGENTS = Path(__file__).resolve().parents[3] / "agents"
sys.path.insert(0, str(AGENTS))
runpy.run_path(str(AGENTS / "claude_code_episode.py"), run_name="__main__")
