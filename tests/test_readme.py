"""The README is a front page whose examples stay true: its run config validates, its verdict
follows the rule, its links exist, and CI runs its commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_cpu_wheel_comes_before_the_package(page):
    """A reader follows the commands in order: the CPU-only wheel must come before the
    first ``pip install -e .``, or that install has already pulled the CUDA build."""
    text = (ROOT / page).read_text()
    commands = "\n".join(re.findall(r"```bash\n(.*?)\n```", text, re.S))
    cpu = re.search(r"^pip install torch\S* --index-url https://download\.pytorch\.org/whl/cpu", commands, re.M)
    assert cpu is not None, f"no CPU-wheel install command in {page}"
    assert cpu.start() < commands.index("pip install -e ."), page
    assert commands.index("python3 -m venv .venv") < cpu.start(), page  # into the venv


def test_what_the_commands_write_is_git_ignored(tmp_path):
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    written = ["mlflow.db", "mlruns/1/meta.yaml", "runs/smoke/state.json", "reports/smoke/report.html",
               "result.json", "best.yaml"]
    proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *written],
                          capture_output=True, text=True, check=False)
    assert sorted(proc.stdout.split()) == sorted(written), proc.stdout + proc.stderr


def test_ci_runs_the_readmes_commands_in_a_fresh_venv():
    """`.ci/run` does what the README tells a new user: a fresh venv, the main job, the tests."""
    readme = README
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("python3 -m venv .venv", ". .venv/bin/activate", 'pip install -e ".[test]" && python -m pytest -q'):
        assert command in readme, command
        assert command in ci, command
    assert "nalu-sweep sweep search_spaces/smoke.yaml --validate 2" in readme
    assert "smoke.yaml\" --validate 2" in ci or "smoke.yaml --validate 2" in ci
    assert ci.index("python3 -m venv") < ci.index(". .venv/bin/activate") < ci.index("pytest")


def test_the_readme_is_a_front_page():
    """At most about 250 lines, no dated measurement logs, and every link into the docs
    points to a page that exists."""
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    assert not re.search(r"\b(at|since|against) commit `?[0-9a-f]{7}", README)  # history is git's
    assert "Sweep overhead" not in README
    assert not re.search(r"\|\s*[0-9a-f]{7}\s*\|", README)  # no commits as table columns
    assert not re.search(r"\d\s*→\s*\d", README) and not re.search(r"\bnow come\b", README)  # no before/after
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if not link.startswith(("http://", "https://")):
            assert (ROOT / link).is_file(), link


def test_the_readme_describes_the_answer_without_figures_that_go_stale():
    """The quick start's answer changes with the code and the run: the README says what it
    holds and leaves the example, with its counts, to Getting started."""
    assert not re.search(r"^Verdict: ", README, re.M)
    assert not re.search(r"\d+/\d+ seeds|\d+ of \d+ seeds|trial-[0-9a-f]{8}", README)
    assert "docs/getting-started.md" in README


@pytest.mark.parametrize("page", ["docs/getting-started.md"])
def test_the_readme_verdict_follows_the_rule(page):
    """The verdict example is what the code would print for its own counts: each interval
    is the Wilson interval of k/n rounded outwards, and the verdict is the rule's for the
    validation's lower end."""
    from service.formatting import fmt_interval
    from service.scoring.metrics import wilson_interval
    from service.scoring.verdict import verdict

    text = (ROOT / page).read_text()
    said = re.search(r"^Verdict: (.+)$", text, re.M).group(1)
    rows = dict((part, (int(k), int(n), ci)) for part, k, n, ci in re.findall(
        r"^  (search|validation): +(\d+)/(\d+) seeds \[95% CI ([0-9.]+–[0-9.]+)\]", text, re.M))
    assert set(rows) == {"search", "validation"}
    for k, n, ci in rows.values():
        assert ci == fmt_interval(*wilson_interval(k, n), "–"), (page, k, n, ci)
    k, n, _ = rows["validation"]
    assert verdict(wilson_interval(k, n)[0], validated=True).words == said


def test_the_readme_names_the_venv_the_main_job_and_a_warm_ray():
    assert "python3 -m venv .venv && . .venv/bin/activate" in README
    assert "pip install -e . && nalu-sweep sweep search_spaces/smoke.yaml --validate 2" in README
    assert "ray start --head" in README
