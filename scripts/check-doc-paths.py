#!/usr/bin/env python3
"""Fails when the docs name a file that does not exist: every `code span` of ARCHITECTURE.md,
README.md and docs/*.md that looks like a file path (a name with one of the extensions below,
or a folder ending in `/`), and every relative Markdown link. A span may be a path from the
repository's root or the tail of one (`cpu/gemm.rs` for crates/sluice-kernels/src/cpu/gemm.rs,
as ARCHITECTURE.md writes paths inside a crate); a link is resolved from the page's folder.
Also keeps ARCHITECTURE.md a map that reads quickly: no paragraph or list item of its prose
longer than LONGEST characters (tables and code blocks aside). Run by scripts/test.sh; prints
each dangling name with the page and line that names it, and each paragraph too long."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = (
    "rs", "py", "sh", "md", "toml", "json", "jsonl", "yml", "yaml", "cu", "txt", "jinja",
    "lock", "ini", "js", "mjs",
)
PATHLIKE = re.compile(r"^[A-Za-z0-9_.\-/]+\.(?:" + "|".join(EXTENSIONS) + r")$")
SPAN = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"\b(?:NAME|ARCH|FILE|PATH|DIR|MODEL|N)\b")
GENERATED = ("models/", "target/", "target-cuda/", ".venv/", "gpu-bundle/", "benchmarks/compare")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# ARCHITECTURE.md's longest paragraph or list item: a section says a crate's job in a few
# short items; depth belongs in docs/.
LONGEST = 650


def tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return [p for p in out.splitlines() if (ROOT / p).exists()]


def main() -> int:
    files = tracked()
    dirs = {str(Path(p).parent) + "/" for p in files}
    for p in list(dirs):
        parts = Path(p).parts
        dirs.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))

    def exists(name: str) -> bool:
        name = name.removeprefix("./")
        if name.endswith("/"):
            return any(d == name or d.endswith("/" + name) for d in dirs)
        return any(f == name or f.endswith("/" + name) for f in files)

    pages = [ROOT / "ARCHITECTURE.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = []
    for page in pages:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for span in SPAN.findall(line):
                span = span.strip()
                # Globs, placeholders (`cuda/NAME.cu`), commands, URLs and routes (`tcp://`,
                # `/openapi.json`), paths on a running host (`/app/...`) and what a script
                # fetches or a build writes (`models/`, `target/`) are not the repository's.
                if (
                    any(c in span for c in "*<>{}$ :")
                    or "..." in span
                    or span.startswith("/")
                    or PLACEHOLDER.search(span)
                    or span.startswith(GENERATED)
                ):
                    continue
                folder = span.endswith("/") and "/" in span[:-1]
                if (PATHLIKE.match(span) and "/" in span or folder) and not exists(span):
                    bad.append(f"{page.relative_to(ROOT)}:{n}: `{span}` names no file")
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                path = target.split("#", 1)[0]
                if path and not (page.parent / path).exists():
                    bad.append(f"{page.relative_to(ROOT)}:{n}: link `{target}` names no file")
    bad += long_paragraphs(ROOT / "ARCHITECTURE.md")
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} dangling path(s) in the docs", file=sys.stderr)
        return 1
    print(f"every path the docs name exists ({len(pages)} pages)")
    return 0


def long_paragraphs(page: Path) -> list[str]:
    """Prose paragraphs and list items of `page` longer than LONGEST characters."""
    bad, item, start, fenced = [], [], 0, False

    def close():
        text = " ".join(item)
        if len(text) > LONGEST:
            bad.append(f"{page.name}:{start}: a paragraph of {len(text)} characters (> {LONGEST})")

    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        new_item = re.match(r"^(\s*[-*] |\d+\. )", line) is not None
        if fenced or not line.strip() or line.startswith(("|", "#", "```")) or new_item:
            close()
            item, start = [], n
        if not fenced and line.strip() and not line.startswith(("|", "#", "```")):
            item.append(line.strip())
    close()
    return bad


if __name__ == "__main__":
    sys.exit(main())
