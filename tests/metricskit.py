"""Scraping a node's ``/metrics`` in tests: prometheus_client's parser, and
the metric names docs/metrics.md documents."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def parse_samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape in Prometheus's text format: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(port: int, path: str = "/metrics") -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return parse_samples(response.read().decode())


def documented_metrics() -> dict[str, set[str]]:
    """docs/metrics.md's metric names by section ("Per partition", "Cluster" ...)."""
    out: dict[str, set[str]] = {}
    section = ""
    for line in DOCS.read_text().splitlines():
        if line.startswith("### "):
            section = line[4:].split(" (")[0].strip()  # "Cluster (with ...)" -> "Cluster"
        elif line.startswith("| `partita_") and section:
            out.setdefault(section, set()).update(re.findall(r"`(partita_[a-z_]+)`", line.split("|")[1]))
    return out


def missing_from(samples, names: set[str]) -> set[str]:
    """The names no sample of a scrape carries (a histogram's samples are its _bucket/_sum/_count)."""
    present = {name for name, _ in samples}
    return {n for n in names if n not in present and not any(p.startswith(n + "_") for p in present)}
