"""completion bash|zsh|fish: shell completion generated from the command tree itself.

The script is static (no call back into better-compute on each TAB): it lists every
command path, its sub-commands and its flags, and completes the choices of flags such as
``-o``. Regenerate it after an upgrade. docs/cli.md says where to put it for each shell.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.registry import add_verb

SHELLS = ("bash", "zsh", "fish")


def command_tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                 ) -> dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]]:
    """{command path: (sub-commands, flags, {flag: choices})} for every parser in the tree."""
    subs: list[str] = []
    flags: list[str] = []
    choices: dict[str, list[str]] = {}
    tree: dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                subs.append(name)
                tree.update(command_tree(child, (*path, name)))
        elif action.help is not argparse.SUPPRESS:
            flags.extend(action.option_strings)
            if action.choices and action.option_strings:
                for flag in action.option_strings:
                    choices[flag] = [str(c) for c in action.choices]
    tree[path] = (subs, flags, choices)
    return tree


def _bash(tree: dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]]) -> str:
    paths = " ".join("|" + " ".join(p) + "|" for p in tree if p)
    cases = []
    for path, (subs, flags, _) in sorted(tree.items()):
        cases.append(f"    {shlex.quote(' '.join(path))}) words={shlex.quote(' '.join(subs + flags))} ;;")
    choice_cases = []
    seen: set[str] = set()
    for _, (_, _, choices) in tree.items():
        for flag, values in choices.items():
            if flag not in seen:
                seen.add(flag)
                choice_cases.append(f"    {flag}) COMPREPLY=($(compgen -W "
                                    f"{shlex.quote(' '.join(values))} -- \"$cur\")); return ;;")
    return f"""# better-compute completion for bash: source <(better-compute completion bash)
_better_compute() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
  local paths={shlex.quote(paths)} path="" candidate word words i
  case "$prev" in
{chr(10).join(choice_cases)}
  esac
  for ((i = 1; i < COMP_CWORD; i++)); do
    word=${{COMP_WORDS[i]}}
    candidate=${{path:+$path }}$word
    [[ "$paths" == *"|$candidate|"* ]] && path=$candidate
  done
  case "$path" in
{chr(10).join(cases)}
    *) words="" ;;
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _better_compute better-compute
"""


def _zsh(tree: dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]]) -> str:
    return ("#compdef better-compute\n# better-compute completion for zsh: "
            "source <(better-compute completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + _bash(tree).split("\n", 1)[1])


def _fish(tree: dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]]) -> str:
    paths = " ".join(shlex.quote(" ".join(p)) for p in tree if p)
    lines = [
        "# better-compute completion for fish: better-compute completion fish | source",
        "function __bc_path",
        f"    set -l paths {paths}",
        "    set -l path ''",
        "    for word in (commandline -opc)[2..-1]",
        "        set -l candidate (string trim -- \"$path $word\")",
        "        if contains -- $candidate $paths",
        "            set path $candidate",
        "        end",
        "    end",
        "    echo $path",
        "end",
        "complete -c better-compute -f",
    ]
    for path, (subs, flags, choices) in sorted(tree.items()):
        condition = f"test (__bc_path) = {shlex.quote(' '.join(path))}" if path else \
            "test -z (__bc_path)"
        if subs:
            lines.append(f"complete -c better-compute -n {shlex.quote(condition)} "
                         f"-a {shlex.quote(' '.join(subs))}")
        for flag in flags:
            option = f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
            values = choices.get(flag)
            extra = f" -x -a {shlex.quote(' '.join(values))}" if values else ""
            lines.append(f"complete -c better-compute -n {shlex.quote(condition)} "
                         f"{option}{extra}")
    return "\n".join(lines) + "\n"


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    tree = command_tree(parser)
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](tree)


def completion(ctx: Context, a: argparse.Namespace) -> None:
    from better_compute.cli.main import build_parser

    print(script(a.shell, build_parser()), end="")


def register(sub: Any) -> None:
    p = add_verb(sub, "completion", completion,
                 "Print the shell completion script for bash, zsh or fish.", output=False,
                 examples=["source <(better-compute completion bash)      # in ~/.bashrc",
                           "source <(better-compute completion zsh)       # in ~/.zshrc",
                           "better-compute completion fish > "
                           "~/.config/fish/completions/better-compute.fish"])
    p.add_argument("shell", choices=SHELLS, help="bash, zsh or fish")
