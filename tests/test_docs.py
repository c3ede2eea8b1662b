"""The documentation site: its CLI reference is generated from the Typer app and lists
every verb and option; every page is in the navigation; it builds with ``--strict`` (broken
links fail); nothing in it points to files a user of the repository does not have."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from service.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_lists_every_verb_and_option_of_the_app():
    text = _load("gen_cli").cli_reference()
    group = typer.main.get_command(app)
    assert group.commands, "the app has no verbs"
    for name, command in group.commands.items():
        assert f"## `nalu-sweep {name}`" in text, name
        section = text.split(f"## `nalu-sweep {name}`", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            if param.param_type_name == "argument":
                assert f"`{param.name.upper()}`" in section, (name, param.name)
            elif not param.hidden:
                for opt in param.opts + param.secondary_opts:
                    assert opt in section, (name, opt)
            if getattr(param, "help", None):
                assert " ".join(param.help.split())[:40] in section, (name, param.name)


def test_the_cli_page_is_generated_not_written_by_hand():
    page = (DOCS / "cli.md").read_text()
    assert "<!-- generated: cli -->" in page
    assert "--tracking-uri" not in page and "| option |" not in page  # no hand-made copy to go stale
    hooks = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "python"))["hooks"]
    assert "docs/hooks.py" in hooks


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages


def test_nothing_points_to_the_projects_private_files():
    """Neither the docs nor what a user reads in the code, the shipped search spaces, the
    benchmarks or the deployment (docstrings, comments) name the team's private notes."""
    shipped = [p for d in ("service", "search_spaces", "benchmarks", "deploy", "dashboards")
               for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".md", ".c", ".sh")]
    for path in [ROOT / "README.md", *DOCS.rglob("*.md"), *shipped]:
        text = path.read_text()
        assert "SPEC.md" not in text and "shared folder" not in text and "../shared" not in text, path


def test_every_search_space_named_in_the_docs_and_the_deployment_exists():
    """A copied example command must find its file (the Slurm script once named a
    ``search_spaces/nalu_mul.yaml`` that never existed)."""
    sources = [ROOT / "README.md", ROOT / "Dockerfile", ROOT / "docker-compose.yml", *DOCS.rglob("*.md"),
               *(p for p in (ROOT / "deploy").rglob("*") if p.is_file())]
    named = {}
    for path in sources:
        if path.is_file():
            for name in re.findall(r"search_spaces/([\w.-]+\.ya?ml)", path.read_text(errors="replace")):
                named.setdefault(name, path.relative_to(ROOT))
    assert "smoke.yaml" in named  # the pattern finds what it should
    missing = {name: str(path) for name, path in named.items() if not (ROOT / "search_spaces" / name).is_file()}
    assert not missing, missing

@pytest.mark.slow  # a real sweep (~20 s here), then the page's snippet on its Tune directory
def test_the_tune_results_snippet_reads_a_real_sweep(tmp_path):
    """docs/ray.md's "Tune's own results" code, word for word, on a sweep named smoke: the
    directory it names resolves, and `Tuner.restore` accepts the trainable it says."""
    section = (DOCS / "ray.md").read_text().split("## Tune's own results", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    sweep = subprocess.run([sys.executable, "-m", "service", "sweep", str(ROOT / "search_spaces" / "smoke.yaml"),
                            "--trials", "2", "--seeds", "2", "--steps", "100", "--eval-every", "50"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = [line for line in proc.stdout.splitlines() if "config/lr" in line]
    assert len(tables) == 2 and all("objective" in line for line in tables), proc.stdout  # both readers'
    rows = re.findall(r"^\d+ +[0-9.e+-]+ +[0-9.e+-]+ +\d+\.0$", proc.stdout, re.M)
    assert len(rows) == 4, proc.stdout  # each of the two trials, in both

def test_the_measured_figures_come_from_the_benchmarks_files(tmp_path):
    results = _load("gen_results")
    assert "No benchmark" in results.results_markdown(tmp_path)
    (tmp_path / "throughput.json").write_text(json.dumps(
        {"command": "python benchmarks/throughput.py", "seed_steps_per_s": {"cpu": 1234.5678}}))
    text = results.results_markdown(tmp_path)
    assert "### `throughput.json`" in text and "python benchmarks/throughput.py" in text
    assert re.search(r"\| `seed_steps_per_s.cpu` \| 1235 \|", text), text


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs and mkdocs-material are the docs extra: pip install -e '.[docs]'")
def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs") or f"{sys.executable} -m mkdocs"
    proc = subprocess.run([*mkdocs.split(), "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "nalu-sweep sweep" in cli and "--validate-seeds" in cli  # the hook ran
