"""The README documents every command, and its quick start is what CI runs."""

from __future__ import annotations

import re

import click

from rinwa_index.cli import cli

from .conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def command_paths(group: click.Group, prefix: str = "") -> list[str]:
    paths = []
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        paths.append(path)
        if isinstance(command, click.Group):
            paths.extend(command_paths(command, path + " "))
    return paths


def test_every_command_is_in_the_readme_with_help() -> None:
    for path in command_paths(cli):
        pattern = r"`rinwa-index (--db \S+ )?" + re.escape(path) + r"\b"
        assert re.search(pattern, README), f"`rinwa-index {path}` is not in the README"
        command = cli
        for part in path.split():
            command = command.commands[part]  # type: ignore[attr-defined]
        assert command.help, f"{path} has no help text"


def test_quick_start_holds_exactly_the_two_commands() -> None:
    block = re.search(r"## Quick start\n\n```sh\n(.*?)```", README, re.S)
    assert block, "the quick start block is missing"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 2
    assert lines[0].endswith("rinwa-index demo")
    ci = (REPO / ".ci" / "run").read_text()
    assert lines[1] in ci, "CI must run the README's test command"
