"""One pluralisation: ``trainhub.fmt.plural`` in Python and ``plural`` of the panel's dom.ts, never a
hand-made "(s)", ``'s' if n != 1`` or ``n === 1 ? '' : 's'`` (issue 34: "1 items").

The texts themselves are checked in tests/core/test_fmt.py; this keeps new messages from going back to
the ad-hoc forms in the places people read counts: the core's texts, the CLI, the kernel side, the spawn and
queue pages and the JupyterLab panel.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted([REPO / "trainhub" / "fmt.py", REPO / "trainhub" / "cli.py", REPO / "trainhub" / "app" / "up.py",
                  REPO / "trainhub" / "serverqueue.py", REPO / "spawner" / "profile_form.py",
                  *(REPO / "trainhub" / "commands").glob("*.py"), *(REPO / "kernels").glob("*.py"),
                  *(REPO / "extensions" / "labextension" / "src").glob("*.ts")])
AD_HOC = [
    re.compile(r"[A-Za-z]\(s\)(?=[ '\"`])"),                      # "job(s) shown" (not a call: show(s))
    re.compile(r"""['"]s['"] if """),                          # f"GPU{'s' if n != 1 else ''}"
    re.compile(r"""['"]{2} if [^'"]+ == 1 else ['"]s['"]"""),  # f"GPU{'' if n == 1 else 's'}"
    re.compile(r"""[!=]== 1 \? ['"]{2} : ['"]s['"]"""),       # `file${n === 1 ? '' : 's'}`
    re.compile(r"""!== 1 \? ['"]s['"]"""),
    # a count written before a plural noun: "${n} files", f"{n} jobs" (use plural(n, 'file'))
    re.compile(r"\{[^{}]+\} (files|items|jobs|models|datasets|versions|trials|lines|samples|workers|days|metrics|reports|retries)\b"),
]


def test_the_sources_are_found():
    assert len(SOURCES) > 20 and all(p.exists() for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_counts_are_written_by_the_one_plural(path):
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
             for pattern in AD_HOC if pattern.search(line)]
    assert not found, "use trainhub.fmt.plural (Python) or plural/noun of dom.ts (panel):\n" + "\n".join(found)


def test_the_panel_and_python_know_the_same_irregular_plurals():
    from trainhub.fmt import IRREGULAR_PLURALS

    dom = (REPO / "extensions" / "labextension" / "src" / "dom.ts").read_text()
    table = re.search(r"const IRREGULAR: Record<string, string> = \{(.*?)\};", dom, re.S).group(1)
    assert dict(re.findall(r"(\w+): '(\w+)'", table)) == IRREGULAR_PLURALS
