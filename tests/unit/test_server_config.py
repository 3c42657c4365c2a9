"""serve's settings: flag > environment > file > default, a checked TOML file, and
docs/configuration.md's table kept equal to api/http/server_config.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from better_compute.api.http.serve import trusted_proxies
from better_compute.api.http.server_config import SETTINGS, resolve, with_file
from better_compute.cli.main import build_parser
from better_compute.domain.errors import InvalidInput
from tests.unit.test_docs_in_step import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
# The CLI's own variables: which server a command talks to (docs/cli.md), not server settings.
CLIENT_VARIABLES = {"BETTER_COMPUTE_URL", "BETTER_COMPUTE_TOKEN", "BETTER_COMPUTE_TENANT",
                    "BETTER_COMPUTE_CA_FILE"}


def _flags() -> dict[str, object]:
    return vars(build_parser().parse_args(["serve"]))


def _table() -> list[list[str]]:
    text = DOC.read_text().split("## Every setting", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_docs_table_is_the_settings() -> None:
    def cell(text: str) -> str:
        return f"`{text}`" if text else "—"

    expected = [[cell(s.key), cell(s.flag or ""), cell(s.env or ""), s.default, s.meaning]
                for s in SETTINGS]
    assert _table() == expected, "docs/configuration.md's table differs from SETTINGS"


def test_every_variable_the_server_reads_is_a_setting() -> None:
    used: set[str] = set()
    for folder in ("api", "projections"):
        for source in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"\bBETTER_COMPUTE_[A-Z_]*[A-Z]\b", source.read_text()))
    missing = sorted(used - CLIENT_VARIABLES - {s.env for s in SETTINGS if s.env})
    assert not missing, (f"read by the server but not in api/http/server_config.py's SETTINGS "
                         f"(nor docs/configuration.md's table): {missing}")


def test_every_serve_flag_is_a_setting() -> None:
    flags = {f for a in COMMANDS["serve"]._actions for f in a.option_strings
             if f.startswith("--") and f != "--help"}
    assert flags == {s.flag for s in SETTINGS if s.flag}


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "server.toml"
    path.write_text(text)
    return str(path)


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    path = _file(tmp_path, 'listen = "0.0.0.0:9443"\n[gateway]\nurl = "https://file"\n'
                           '[log]\nformat = "json"\n[store]\ndata_dir = "/file"\n'
                           'database_url = "postgresql://bc@file/x"\n[tokens]\nttl = "30d"\n')
    env = {"BETTER_COMPUTE_GATEWAY_URL": "https://env", "BETTER_COMPUTE_DATA_DIR": "/env"}
    flags = {**_flags(), "log_format": "text"}
    config = resolve(flags, env, path)
    assert config.values["listen"] == "0.0.0.0:9443"  # file over default
    assert config.values["gateway.url"] == "https://env"  # environment over file
    assert config.values["log.format"] == "text"  # flag over file
    assert config.values["log.level"] == "warning"  # default
    assert config.env["BETTER_COMPUTE_DATA_DIR"] == "/env"  # environment over file
    assert config.env["BETTER_COMPUTE_DATABASE_URL"] == "postgresql://bc@file/x"
    assert config.env["BETTER_COMPUTE_TOKEN_TTL"] == "30d"
    assert resolve({**flags, "gateway_url": "https://flag"}, env, path).values[
        "gateway.url"] == "https://flag"


def test_the_environment_names_the_file_for_in_process_commands(tmp_path: Path) -> None:
    path = _file(tmp_path, '[store]\ndata_dir = "/srv/bc"\n')
    merged = with_file({"BETTER_COMPUTE_CONFIG": path})
    assert merged["BETTER_COMPUTE_DATA_DIR"] == "/srv/bc"
    assert with_file({}) == {}


def test_a_list_in_the_file_reaches_the_environment_comma_separated(tmp_path: Path) -> None:
    path = _file(tmp_path, '[http]\ntrusted_proxies = ["10.0.0.5", "fd00::/8"]\n')
    merged = with_file({"BETTER_COMPUTE_CONFIG": path})
    assert merged["BETTER_COMPUTE_HTTP_TRUSTED_PROXIES"] == "10.0.0.5,fd00::/8"
    assert trusted_proxies(merged) == ["10.0.0.5", "fd00::/8"]
    assert trusted_proxies({}) == []  # none by default: X-Forwarded-For is never believed


@pytest.mark.parametrize(("text", "needle"), [
    ('lisen = "x"\n', "unknown setting 'lisen' (did you mean listen?)"),
    ("[store]\ndatabase = 1\n", "unknown setting 'store.database' (did you mean "
                                "store.database_url?)"),
    ("insecure_loopback = \"yes\"\n", "insecure_loopback = 'yes' is not true or false"),
    ('[log]\nlevel = "loud"\n', "log.level = 'loud' is not 'critical' or"),
    ("hostnames = \"a\"\n", "is not a list of strings"),
    ("[tokens]\nttl = true\n", "is not seconds or a duration"),
    ("listen = \n", "is not TOML"),
])
def test_a_bad_file_is_refused_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(InvalidInput) as refused:
        resolve(_flags(), {}, path)
    assert needle in str(refused.value) and str(tmp_path) in str(refused.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file"):
        resolve(_flags(), {}, str(tmp_path / "nope.toml"))


def test_a_missing_file_named_by_the_environment_says_so(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"BETTER_COMPUTE_CONFIG .*: no such file"):
        with_file({"BETTER_COMPUTE_CONFIG": str(tmp_path / "nope.toml")})
