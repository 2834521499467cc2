"""The harness: the text an agent runs with around its model, versioned like weights.

A harness is a small tree of UTF-8 text files that a release carries instead of (or beside)
weights. Its layout (POSIX paths, relative to the tree's root):

- `AGENTS.md`: the system rules (optional).
- `skills/<name>/SKILL.md`: one skill each, with YAML front matter between `---` lines at the
  top (`name`, equal to `<name>`, and `description`); other files under `skills/<name>/` are
  the skill's references.
- `prompts/<name>.md`: prompt templates.
- `harness.json`: a JSON object of settings (optional), e.g. {"inject": true}.
- `extensions/...` and `scripts/...`: allowed, but executable content (so are files that start
  with `#!` or end in a script suffix, and prompts and skill files an agent would run: a
  `!`-backtick shell line, `allowed-tools` front matter), which a reviewer must see before a
  release is served: any change to it (`changed_executable`) holds the harness for review.

Nothing else is allowed, and sizes are bounded, so a harness can be checked, hashed, diffed and
edited in memory. `content_hash` equals "sha256:" + `artifacts.tree_hash` of the directory that
`write` produces, so a harness and its release tree name the same content.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from reef.artifacts import MANIFEST, ArtifactStore
from reef.errors import BadRequest
from reef.records import Release

if TYPE_CHECKING:
    pass

MAX_FILE_BYTES = 64 * 1024
MAX_TOTAL_BYTES = 1024 * 1024
MAX_FILES = 200
MAX_DEPTH = 6
MAX_DESCRIPTION = 1024

RULES_FILE = "AGENTS.md"
CONFIG_FILE = "harness.json"
EXECUTABLE_DIRS = ("extensions", "scripts")
SCRIPT_SUFFIXES = (".sh", ".py", ".js", ".mjs", ".ts", ".bash", ".zsh", ".ps1")

# Markdown a coding agent runs: Claude Code and opencode turn prompts into commands, where a
# !`cmd` line runs cmd in a shell when the command is used (skills likewise), and front matter
# `allowed-tools` grants tools without asking.
AGENT_DIRS = ("prompts", "skills")
SHELL_LINE = "!`"
_ALLOWED_TOOLS = re.compile(r"^\s*allowed[-_]tools\s*:", re.IGNORECASE | re.MULTILINE)

_PATH_CHARS = re.compile(r"[A-Za-z0-9._/-]+")
_SKILL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_SKILL_FILE = re.compile(r"skills/([^/]+)/SKILL\.md")
_EDIT_OPS = ("create", "update", "remove")


def _bad(path: str, reason: str) -> BadRequest:
    return BadRequest(f"harness file '{path}': {reason}", code="invalid_harness", param=path)


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: str  # of its SKILL.md


@dataclass(frozen=True)
class Harness:
    """The files of a harness (path -> text). Built unchecked; `validate` checks it."""

    files: Mapping[str, str]

    def __post_init__(self) -> None:
        # a private read-only copy: a caller's later edits to its dict cannot reach this one
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))

    @classmethod
    def empty(cls) -> Harness:
        return cls({})

    def validate(self) -> Harness:
        """This harness, or BadRequest naming the first offending path and why."""
        paths = sorted(self.files, key=str)
        if len(paths) > MAX_FILES:
            raise _bad(paths[MAX_FILES], f"a harness holds at most {MAX_FILES} files")
        total = 0
        for path in paths:
            _check_path(path)
            _check_layout(path)
            content = self.files[path]
            if not isinstance(content, str):
                raise _bad(path, "content must be text")
            if "\0" in content:
                raise _bad(path, "content holds a NUL character")
            try:
                size = len(content.encode("utf-8"))
            except UnicodeEncodeError:
                raise _bad(path, "content is not valid Unicode text") from None
            if size > MAX_FILE_BYTES:
                raise _bad(path, f"{size} bytes, over the limit of {MAX_FILE_BYTES}")
            total += size
            if total > MAX_TOTAL_BYTES:
                raise _bad(path, f"brings the harness over {MAX_TOTAL_BYTES} bytes in all")
        _check_tree(paths)
        self.skills()
        self.config()
        return self

    def content_hash(self) -> str:
        """sha256 over the (path, content) pairs sorted by path segments: each is the path, NUL
        (which no valid path holds), then the content's 32-byte sha256: `tree_hash`'s bytes."""
        h = hashlib.sha256()
        for path in sorted(self.files, key=lambda p: p.split("/")):
            h.update(path.encode() + b"\0")
            h.update(hashlib.sha256(self.files[path].encode()).digest())
        return "sha256:" + h.hexdigest()

    def manifest(self) -> dict[str, Any]:
        data = {path: self.files[path].encode() for path in sorted(self.files)}
        files = [
            {"path": p, "sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
            for p, b in data.items()
        ]
        return {"content_hash": self.content_hash(), "files": files}

    def rules(self) -> str:
        return self.files.get(RULES_FILE, "")

    def config(self) -> dict[str, Any]:
        if CONFIG_FILE not in self.files:
            return {}
        try:
            config = json.loads(self.files[CONFIG_FILE])
        except json.JSONDecodeError as e:
            raise _bad(CONFIG_FILE, f"not JSON ({e})") from None
        if not isinstance(config, dict):
            raise _bad(CONFIG_FILE, "must hold a JSON object")
        return config

    def skills(self) -> list[Skill]:
        found = [
            _skill(path, match.group(1), _front_matter(path, content))
            for path, content in self.files.items()
            if (match := _SKILL_FILE.fullmatch(path))
        ]
        return sorted(found, key=lambda s: s.name)

    def executable_files(self) -> list[str]:
        """Paths a reviewer must read as code: extension and script folders, shebangs, script
        suffixes, and prompts and skill files that run commands or grant tools in an agent."""
        return sorted(path for path, content in self.files.items() if is_executable(path, content))

    def executable_hashes(self) -> dict[str, str]:
        """Each executable path with the sha256 of its content."""
        return {
            path: hashlib.sha256(self.files[path].encode()).hexdigest()
            for path in self.executable_files()
        }

    def system_text(self) -> str:
        """What server-side injection puts before a request: the rules, then a catalog of
        the skills (one line each); "" when there is neither."""
        sections = [rules] if (rules := self.rules().strip()) else []
        skills = self.skills()
        if skills:
            lines = [f"- {s.name}: {' '.join(s.description.split())} ({s.path})" for s in skills]
            sections.append(
                "## Skills\n\nEach skill's file holds its full instructions: read it before "
                "using the skill.\n\n" + "\n".join(lines)
            )
        return "\n\n".join(sections)

    def inject(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A new message list with `system_text` in its system message (the input and its
        dicts are left as they were)."""
        text = self.system_text()
        out = list(messages)
        if not text:
            return out
        if out and out[0].get("role") in ("system", "developer"):
            first, content = out[0], out[0].get("content")
            if isinstance(content, str):
                out[0] = {**first, "content": f"{text}\n\n{content}" if content else text}
                return out
            if isinstance(content, list):
                out[0] = {**first, "content": [{"type": "text", "text": text}, *content]}
                return out
        out.insert(0, {"role": "system", "content": text})
        return out

    def apply(self, edits: Sequence[Mapping[str, Any]]) -> Harness:
        """A new, validated harness with `edits` applied in order. Each is {"op": "create" |
        "update" | "remove", "path": ..., "content": ... (create and update)}."""
        files = dict(self.files)
        for i, edit in enumerate(edits):
            op, path = _edit_target(i, edit)
            exists = path in files
            if op == "create" and exists:
                raise _edit_error(i, f"cannot create '{path}': it exists")
            if op != "create" and not exists:
                raise _edit_error(i, f"cannot {op} '{path}': no such file")
            if op == "remove":
                del files[path]
                continue
            content = edit.get("content")
            if not isinstance(content, str):
                raise _edit_error(i, f"{op} of '{path}' needs a string 'content'")
            files[path] = content
        return Harness(files).validate()

    def write(self, directory: Path) -> None:
        """The files under `directory` (validated first, so no path leaves it); files already
        there and not in the harness are left alone."""
        self.validate()
        for path, content in self.files.items():
            target = directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode())  # bytes: no newline translation

    @classmethod
    def read(cls, directory: Path) -> Harness:
        """The validated harness under `directory` (a top-level .manifest.json is skipped)."""
        if not directory.is_dir():
            raise BadRequest(f"'{directory}' is not a directory", code="invalid_harness")
        files: dict[str, str] = {}
        _read_into(directory, directory, files)
        return cls(files).validate()


def diff(old: Harness, new: Harness) -> dict[str, list[str]]:
    """Which paths `new` created, updated and removed relative to `old`."""
    return {
        "created": sorted(set(new.files) - set(old.files)),
        "updated": sorted(
            p for p in set(old.files) & set(new.files) if old.files[p] != new.files[p]
        ),
        "removed": sorted(set(old.files) - set(new.files)),
    }


def is_executable(path: str, content: str) -> bool:
    """Whether a file of a harness is code something runs (see the module's docstring)."""
    top = path.split("/")[0]
    if top in EXECUTABLE_DIRS or content.startswith("#!") or path.lower().endswith(SCRIPT_SUFFIXES):
        return True
    if top not in AGENT_DIRS:
        return False
    return SHELL_LINE in content or bool(_ALLOWED_TOOLS.search(_front_matter_text(content)))


def _front_matter_text(content: str) -> str:
    """The text between a leading '---' line and the next one ("" without front matter)."""
    lines = content.split("\n")
    if lines[0].rstrip() != "---":
        return ""
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), len(lines))
    return "\n".join(lines[1:end])


def changed_executable(old: Harness, new: Harness) -> list[str]:
    """The executable paths whose content differs between `old` (the head's harness) and `new`
    (path -> sha256): created, updated, removed, or turned executable. What a reviewer must
    read before `new` is served; removals count too, since dropping a guard changes what runs."""
    before, after = old.executable_hashes(), new.executable_hashes()
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def _check_path(path: object) -> None:
    if not isinstance(path, str) or not path:
        raise _bad(str(path), "a path must be a non-empty string")
    if path.startswith("/"):
        raise _bad(path, "absolute path; paths are relative to the harness root")
    if "\\" in path:
        raise _bad(path, "backslash in path; use '/'")
    if not _PATH_CHARS.fullmatch(path):
        raise _bad(path, "paths may hold only letters, digits, '.', '_', '-' and '/'")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise _bad(path, "empty, '.' or '..' segment in path")
    if len(parts) > MAX_DEPTH:
        raise _bad(path, f"deeper than {MAX_DEPTH} levels")


def _check_layout(path: str) -> None:
    parts = path.split("/")
    top = parts[0]
    if len(parts) == 1 and top in (RULES_FILE, CONFIG_FILE):
        return
    if len(parts) > 1 and top in EXECUTABLE_DIRS:
        return
    if top == "prompts" and len(parts) > 1:
        if not path.endswith(".md"):
            raise _bad(path, "prompt templates are .md files")
        return
    if top == "skills" and len(parts) > 2:
        if not _SKILL_NAME.fullmatch(parts[1]):
            raise _bad(path, f"skill folder '{parts[1]}' must match {_SKILL_NAME.pattern}")
        return
    if top == "skills":
        raise _bad(path, "skill files go under skills/<name>/")
    raise _bad(
        path,
        "not part of a harness layout (AGENTS.md, harness.json, skills/<name>/, prompts/, "
        "extensions/, scripts/)",
    )


def _check_tree(paths: list[str]) -> None:
    """Every skill folder has a SKILL.md, and no path is both a file and a folder."""
    folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    present = set(paths)
    for path in paths:
        if path in folders:
            raise _bad(path, "is both a file and a folder")
        skill = path.split("/")[1] if path.startswith("skills/") else None
        if skill and f"skills/{skill}/SKILL.md" not in present:
            raise _bad(path, f"its skill has no skills/{skill}/SKILL.md")


def _front_matter(path: str, content: str) -> dict[str, Any]:
    lines = content.split("\n")
    if lines[0].rstrip() != "---":
        raise _bad(path, "SKILL.md must start with front matter between '---' lines")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if end is None:
        raise _bad(path, "front matter has no closing '---' line")
    try:
        front = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as e:
        raise _bad(path, f"front matter is not YAML ({e})") from None
    if not isinstance(front, dict):
        raise _bad(path, "front matter must be a YAML mapping")
    return front


def _skill(path: str, folder: str, front: dict[str, Any]) -> Skill:
    name, description = front.get("name"), front.get("description")
    if name != folder:
        raise _bad(path, f"front matter name {name!r} must equal its folder '{folder}'")
    if not isinstance(description, str) or not description.strip():
        raise _bad(path, "front matter needs a non-empty string 'description'")
    if len(description) > MAX_DESCRIPTION:
        raise _bad(path, f"description is over {MAX_DESCRIPTION} characters")
    return Skill(name=folder, description=description.strip(), path=path)


def _edit_target(i: int, edit: object) -> tuple[str, str]:
    if not isinstance(edit, Mapping):
        raise _edit_error(i, "an edit must be an object")
    op, path = edit.get("op"), edit.get("path")
    if op not in _EDIT_OPS:
        raise _edit_error(i, f"op must be one of {', '.join(_EDIT_OPS)}, not {op!r}")
    if not isinstance(path, str):
        raise _edit_error(i, "an edit needs a string 'path'")
    return op, path


def _edit_error(i: int, reason: str) -> BadRequest:
    return BadRequest(f"harness edit {i}: {reason}", code="invalid_harness", param=f"edits[{i}]")


def _read_into(root: Path, folder: Path, files: dict[str, str]) -> None:
    for entry in sorted(folder.iterdir()):
        rel = entry.relative_to(root).as_posix()
        if entry.is_symlink():
            raise _bad(rel, "symbolic links are not allowed in a harness")
        if entry.is_dir():
            _read_into(root, entry, files)
            continue
        if not entry.is_file():
            raise _bad(rel, "not a regular file")
        if rel == MANIFEST:
            continue
        if len(files) >= MAX_FILES or entry.stat().st_size > MAX_FILE_BYTES:
            raise _bad(rel, f"over the limits ({MAX_FILES} files, {MAX_FILE_BYTES} bytes a file)")
        try:
            files[rel] = entry.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(rel, "not UTF-8 text") from None


# On the release chain -----------------------------------------------------------------------
# A release carries a harness in `metadata["harness"]` ({"key", "uri", "content_hash"}: the
# artifact tree of its files), beside the weights it names in `kind`/`uri`. A harness release
# keeps its parent's weights; a weights release made on top of a harness keeps the harness.
# deploy/candidates.py shapes and registers them.


def harness_of(release: Release) -> dict[str, Any] | None:
    """The harness reference a release carries, if any."""
    ref = release.metadata.get("harness")
    return ref if isinstance(ref, dict) and ref.get("key") else None


class HarnessCache:
    """Harnesses of releases, read from the artifact store once (a release never changes)."""

    def __init__(self, artifacts: ArtifactStore, cache_dir: Path):
        self.artifacts = artifacts
        self.cache_dir = cache_dir
        self._by_key: dict[str, Harness] = {}

    def get(self, release: Release) -> Harness | None:
        """The release's harness (blocking on first use: call from a thread)."""
        ref = harness_of(release)
        if ref is None:
            return None
        key = str(ref["key"])
        hit = self._by_key.get(key)
        if hit is None:
            hit = Harness.read(self.artifacts.fetch_tree(key, self.cache_dir / key))
            self._by_key[key] = hit
        return hit
