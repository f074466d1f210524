"""The README and docs/ as a newcomer uses them: every relative link (and anchor) resolves, the README stays a
front door, and every `rlx train / sweep / ablate` command in a bash block composes and validates as written, unless
it names what it needs (a model directory: DIR, /models/, ...)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NEEDS = ("DIR", "/models/", "...")  # placeholders for what the reader brings: the line cannot run as written


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    slugs = [
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", prose(page.read_text()), re.M)
    ]
    return set(slugs)


def links() -> list[tuple[Path, str]]:
    return [
        (page, target)
        for page in PAGES
        for target in LINK.findall(prose(page.read_text()))
        if not re.match(r"^[a-z]+:", target)
    ]


def test_there_are_links_to_check():
    assert len(links()) >= 30


@pytest.mark.parametrize(("page", "target"), links(), ids=lambda x: x.name if isinstance(x, Path) else x)
def test_every_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    assert file.exists(), f"{page.name}: {target} -> {file} does not exist"
    if anchor:
        assert anchor in anchors(file), f"{page.name}: #{anchor} is no heading of {file.name}"


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text) <= 9_000, len(text)
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(text)}
    missing = [p.name for p in PAGES[1:] if p.name not in linked]
    assert not missing, f"docs pages the README's contents do not link: {missing}"


def commands() -> list[str]:
    """The ``rlx train|sweep|ablate`` lines of every bash block, continuations joined, comments dropped."""
    found = []
    for page in PAGES:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                usage = any(c in line for c in "[<…")  # a synopsis, not a command
                if re.match(r"rlx (train|sweep|ablate)\b", line) and not usage and line not in found:
                    found.append(line)
    return found


def test_the_docs_show_commands():
    assert len(commands()) >= 30


@pytest.mark.parametrize("line", commands())
def test_every_command_in_the_docs_composes_and_validates(line, monkeypatch):
    from rlx_cli.config.compose import compose
    from rlx_cli.config.validate import validate
    from rlx_cli.studies.sweep import ablate_points, expand, plan

    if any(need in line for need in NEEDS):
        pytest.skip("names what it needs")
    monkeypatch.chdir(REPO)  # example files are named relative to the repository
    command, *args = shlex.split(line)[1:]
    options = {
        "--jobs": 1,
        "--seeds": 1,
        "--study": 1,
        "--cfg": 1,
        "--launcher": 1,
        "--dry-run": 0,
        "--rerun": 0,
        "--plan": 1,
        "--until-decided": 0,
        "--max-seeds": 1,
        "--every": 1,
        "--control": 0,
        "--no-control": 0,
    }
    if "--plan" in args:  # a declared study: its file parses and every arm composes and validates
        from rlx_cli.studies import deciding, study_plan

        design = {"design": "until_decided"} if "--until-decided" in args else {}
        assert deciding.arm_points(study_plan.load(Path(args[args.index("--plan") + 1]), **design))
        return
    seeds, overrides, i = 3, [], 0
    while i < len(args):
        if args[i] in options:
            seeds = int(args[i + 1]) if args[i] == "--seeds" else seeds
            i += 1 + options[args[i]]
        else:
            overrides.append(args[i])
            i += 1
    if command == "train":
        validate(compose(overrides))
    elif command == "sweep":
        assert plan(expand(overrides))
    else:
        assert plan(ablate_points(overrides, seeds))
