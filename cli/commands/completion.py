"""completion bash|zsh|fish: shell completion generated from the command tree itself.

The script lists every command path, its sub-commands and its flags, and completes the
choices of flags such as ``-o`` with no call back into better-compute. The values that name
objects (``--pool``, ``--site``, ``nodes get NODE``, ``release RSV``, …) are completed
dynamically: on TAB the script runs ``better-compute completion --names KIND``, which prints
the ids and names of the objects of that kind the caller sees (one a line; nothing, quietly,
when there is no server or store to ask). Regenerate the script after an upgrade.
docs/cli.md says where to put it for each shell.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.registry import add_verb
from better_compute.domain.errors import InvalidInput

SHELLS = ("bash", "zsh", "fish")
# The kinds of object whose ids and names are completed, by the metavar of the flags and
# arguments that take one.
KINDS = {"SITE": "site", "POOL": "pool", "NODE": "node", "RSV": "rsv"}
NAMES_TIMEOUT_S = 5  # a TAB never hangs on a server that does not answer


def value_kinds(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                ) -> tuple[dict[str, str], dict[tuple[str, ...], str]]:
    """({flag: kind} of the flags that take an object, {command path: kind} of the commands
    whose first argument is one)."""
    flags: dict[str, str] = {}
    positionals: dict[tuple[str, ...], str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                more_flags, more_positionals = value_kinds(child, (*path, name))
                flags.update(more_flags)
                positionals.update(more_positionals)
        elif isinstance(action.metavar, str) and action.metavar in KINDS:
            if action.option_strings:
                flags.update(dict.fromkeys(action.option_strings, KINDS[action.metavar]))
            elif path not in positionals:
                positionals[path] = KINDS[action.metavar]
    return flags, positionals


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


def _bash(tree: dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]],
          kinds: tuple[dict[str, str], dict[tuple[str, ...], str]]) -> str:
    flag_kinds, positional_kinds = kinds
    kind_flags = "\n".join(f"    {flag}) kind={kind} ;;" for flag, kind in sorted(flag_kinds.items()))
    kind_paths = "\n".join(f"    {shlex.quote(' '.join(path))}) kind={kind} ;;"
                           for path, kind in sorted(positional_kinds.items()))
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
  local kind=""
  case "$prev" in
{kind_flags}
  esac
  if [[ -z "$kind" && -n "$path" && "$cur" != -* && "$prev" == "${{path##* }}" ]]; then
    case "$path" in
{kind_paths}
    esac
  fi
  if [[ -n "$kind" ]]; then
    words=$(_better_compute_names "$kind")
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    return
  fi
  case "$path" in
{chr(10).join(cases)}
    *) words="" ;;
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
_better_compute_names() {{
  # The ids and names of the objects of one kind the caller sees (quietly nothing on failure).
  if command -v timeout >/dev/null 2>&1; then
    timeout {NAMES_TIMEOUT_S} better-compute completion --names "$1" 2>/dev/null
  else
    better-compute completion --names "$1" 2>/dev/null
  fi
}}
complete -o default -F _better_compute better-compute
"""


def _zsh(tree: dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]],
         kinds: tuple[dict[str, str], dict[tuple[str, ...], str]]) -> str:
    return ("#compdef better-compute\n# better-compute completion for zsh: "
            "source <(better-compute completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n"
            + _bash(tree, kinds).split("\n", 1)[1])


def _fish(tree: dict[tuple[str, ...], tuple[list[str], list[str], dict[str, list[str]]]],
          kinds: tuple[dict[str, str], dict[tuple[str, ...], str]]) -> str:
    flag_kinds = kinds[0]
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
            if flag in flag_kinds:
                names = f"(better-compute completion --names {flag_kinds[flag]} 2>/dev/null)"
                extra = f" -x -a {shlex.quote(names)}"
            lines.append(f"complete -c better-compute -n {shlex.quote(condition)} "
                         f"{option}{extra}")
    return "\n".join(lines) + "\n"


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    tree = command_tree(parser)
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](tree, value_kinds(parser))


def _names(ctx: Context, kind: str) -> list[str]:
    """The ids, then the names, of the objects of ``kind`` the caller sees."""
    if kind == "rsv":
        items = ctx.call_pages("reservations.list", tenantId=ctx.tenant)
        return [str(r["id"]) for r in reversed(items)]  # the newest first
    method = {"site": "sites.list", "pool": "pools.list", "node": "nodes.list"}[kind]
    items = ctx.call(method, tenantId=ctx.tenant) if kind == "node" else ctx.call(method)
    ids = [str(item["id"]) for item in items]
    if kind == "node":
        names = [(item.get("hardware") or {}).get("hostname") for item in items]
    else:
        names = [item.get("name") or item.get("key") for item in items]
    # Only names a shell word can hold as it is (no spaces): a TAB must not split one in two.
    return ids + sorted({n for n in names if n and not any(c.isspace() for c in n)})


def completion(ctx: Context, a: argparse.Namespace) -> None:
    if a.names:
        if a.shell:
            raise InvalidInput("completion takes a SHELL or --names KIND, not both")
        print("".join(f"{word}\n" for word in _names(ctx, a.names)), end="")
        return
    if not a.shell:
        raise InvalidInput("completion needs a shell: bash, zsh or fish "
                           "(or --names KIND, what the scripts call on TAB)")
    print(script(a.shell, a.root_parser), end="")


def register(sub: Any) -> None:
    p = add_verb(sub, "completion", completion,
                 "Print the shell completion script for bash, zsh or fish.", output=False,
                 examples=["source <(better-compute completion bash)      # in ~/.bashrc",
                           "source <(better-compute completion zsh)       # in ~/.zshrc",
                           "better-compute completion fish > "
                           "~/.config/fish/completions/better-compute.fish"])
    p.add_argument("shell", nargs="?", choices=SHELLS, help="bash, zsh or fish")
    p.add_argument("--names", choices=sorted(set(KINDS.values())), metavar="KIND",
                   help="print the ids and names of the objects of KIND (site, pool, node, "
                   "rsv) you see, one a line: what the scripts run on TAB")
