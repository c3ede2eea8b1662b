"""MkDocs hooks: pages whose content is generated at build time from the code and the
benchmarks' own outputs, never written by hand.

- ``<!-- generated: cli -->`` becomes the CLI reference (`docs/gen_cli.py`, from the Typer app);
- ``<!-- generated: benchmark-results -->`` becomes one table per `benchmarks/results/*.json`
  (`docs/gen_results.py`), each written by the benchmark that measured it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"nalu_sweep_docs_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - the hook's signature
    if "<!-- generated: cli -->" in markdown:
        markdown = markdown.replace("<!-- generated: cli -->", _load("gen_cli").cli_reference())
    if "<!-- generated: benchmark-results -->" in markdown:
        markdown = markdown.replace("<!-- generated: benchmark-results -->", _load("gen_results").results_markdown())
    return markdown
