"""docs/BENCHMARKS.md as a reader checks it: every raw file it names lies in docs/results/ (or the repository), and
every figure that README.md's table of figures quotes is one of its figures: the page is the figures' one source."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path: str) -> str:
  with open(os.path.join(ROOT, path)) as f:
    return f.read()


def expanded(name: str) -> list[str]:
  """A name with {a,b} alternatives (as the page writes several files at once) as the names it stands for."""
  m = re.search(r"\{([^}]*)\}", name)
  if not m:
    return [name]
  return [n for alt in m.group(1).split(",") for n in expanded(name[:m.start()] + alt + name[m.end():])]


def test_every_raw_file_the_page_names_exists():
  named = set(re.findall(r"`([^`\s]+\.(?:json|jsonl|txt|log|png|md))`", read("docs/BENCHMARKS.md")))
  placeholders = ("…", "<", "DATE", "OUT", "FILE", "/tmp")  # the commands' own outputs, not files of the page
  missing = [name for pattern in named if not any(p in pattern for p in placeholders) for name in expanded(pattern)
             if not any(glob.glob(os.path.join(ROOT, where, name)) for where in ("docs/results", ""))]
  assert len(named) > 30 and not missing, missing


def test_the_readme_quotes_figures_of_the_page():
  readme = read("README.md")
  figures = readme[readme.index("## Figures"):readme.index("\n## ", readme.index("## Figures") + 1)]
  page = read("docs/BENCHMARKS.md")
  rates = re.findall(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,])", figures)  # images/s: 55,146
  ratios = [r.rstrip("×") for r in re.findall(r"\d+\.\d+×", figures)]  # 2.57×
  assert len(rates) > 20 and len(ratios) > 10
  assert [f for f in rates + ratios if f not in page] == []
