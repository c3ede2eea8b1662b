"""The README's examples stay true: its run config validates, CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from service.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_run_config_example_validates():
    blocks = re.findall(r"```yaml\n(.*?)```", README, re.S)
    assert blocks, "README has no YAML example"
    config = RunConfig.model_validate(yaml.safe_load(blocks[0]))
    assert set(config.task.extrapolation) == {"wide", "negative"}


def test_ci_runs_exactly_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command.strip() in (ROOT / ".ci" / "run").read_text()
