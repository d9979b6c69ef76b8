"""The client API reference (`make docs`, pdoc) renders the classes users start from, and none of their
public methods or properties goes without a docstring. No broker needed."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

from tidemark.client import Admin, Producer, PullConsumer, PushConsumer

ROOT = Path(__file__).resolve().parent.parent.parent
CLASSES = (Admin, Producer, PushConsumer, PullConsumer)

# Public members still without a docstring, written out: a new one fails the test, and so does a listed
# one that got its docstring (the list may only shrink). Empty now: every public member is documented.
STILL_UNDOCUMENTED: set[str] = set()


def public_members(cls: type) -> list[str]:
    """Public methods and properties of cls, inherited ones included (Admin's come from its mixins)."""
    return sorted(name for name, value in inspect.getmembers(cls)
                  if not name.startswith("_")
                  and (inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, property)))


def api_modules() -> list[str]:
    """What the Makefile's docs target documents: tidemark.client, Admin's subject modules and the
    consumers' shared base."""
    admin_parts = sorted(p.stem for p in (ROOT / "client").glob("admin_*.py"))
    return ["tidemark.client", *(f"tidemark.client.{m}" for m in admin_parts), "tidemark.client.consumer.blocking"]


def test_every_public_method_and_property_has_a_docstring():
    undocumented = {f"{cls.__name__}.{name}" for cls in CLASSES for name in public_members(cls)
                    if not (inspect.getdoc(getattr(cls, name)) or "").strip()}
    assert undocumented - STILL_UNDOCUMENTED == set(), "public API without a docstring"
    assert STILL_UNDOCUMENTED - undocumented == set(), "documented now: remove from STILL_UNDOCUMENTED"
    assert all((cls.__doc__ or "").strip() for cls in CLASSES)
    assert len(public_members(Admin)) >= 49  # the mixins are seen: not only Admin's lifecycle


def member_entry(page: str, anchor: str) -> str:
    """The HTML of one member's entry on a pdoc page, up to the next member or section."""
    start = page.index(f'id="{anchor}"')
    after_tag = page.index(">", start)
    ends = [i for i in (page.find('class="classattr"', after_tag), page.find("</section>", after_tag)) if i != -1]
    return page[start:min(ends)]


def test_pdoc_renders_the_reference_of_the_client_classes(tmp_path):
    out = tmp_path / "api"
    run = subprocess.run([sys.executable, "-m", "pdoc", "-o", str(out), *api_modules()],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    client_page = out / "tidemark" / "client.html"
    page = client_page.read_text()
    for cls in CLASSES:
        assert f'<section id="{cls.__name__}">' in page, f"no entry for {cls.__name__}"
        for name in public_members(cls):
            anchor = f"{cls.__name__}.{name}"
            entry = member_entry(page, anchor)  # ValueError: the page lost the member
            if anchor in STILL_UNDOCUMENTED:
                continue
            # An inherited member (Admin's mixins) is a link to its entry on its module's page.
            link = re.match(rf'id="{re.escape(anchor)}" class="\w+"><a href="([^"#]+)#([^"]+)"', entry)
            if link is not None:
                target = (client_page.parent / link.group(1)).read_text()
                entry = member_entry(target, link.group(2))
            assert 'class="docstring"' in entry, f"{anchor}: rendered without its docstring"
