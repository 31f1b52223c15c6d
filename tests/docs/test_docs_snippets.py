"""Every snippet of docs/*.md runs as written, or names the test that runs it (issue 39: "the docs
tests run every README and docs snippet"; tests/docs/test_readme.py runs the README's):

- a block without a directive runs here, in order, against one broker: `sh` with `oncelog` on the
  PATH and the broker's address for 127.0.0.1:9092 (and as $ONCELOG_BOOTSTRAP_SERVER), `python`
  with this interpreter;
- `<!-- docs-test: skip (why) -->` is for a block that runs for minutes, needs a Spark session,
  Kafka's own scripts or a cluster: the reason names the test (or the benchmark) that runs it,
  which must exist, `tests/x.py::test_name` naming a test of that file;
- `<!-- quickstart:NAME -->` blocks are docs/security.md's secure quick start, run in order by
  tests/compat/test_security_quickstart.py;
- whatever runs where, every `oncelog` command line of a snippet (the README's skipped ones too)
  parses as the installed command line parses it: its commands, options and values;
- `properties` blocks are read as oncelog reads them: a client's `--command-config` file with no
  refused name, a broker's settings with no name oncelog would ignore;
- every block says its language (`text` for layouts, diagrams and output)."""
from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from docs_cli import ask

from oncelog.broker.config import BrokerConfig
from oncelog.client import config_keys
from oncelog.client.properties import client_settings
from oncelog.core.properties import parse_properties

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
# a fence may be indented (in a list item), its body by as much
BLOCK = re.compile(r"(?:^[ \t]*<!-- (?P<directive>[^>]*?) -->\n)?^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)\n"
                   r"(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
LANGUAGES = {"sh", "python", "text", "properties", "js"}
RUNNABLE = {"sh", "python"}     # here; a `js` block names the test that runs it
NAMED = re.compile(r"\b((?:tests|bench|examples|compat)/[\w/.-]+\.\w+)(?:::(\w+))?")


@dataclass
class Snippet:
    doc: Path
    line: int
    lang: str
    body: str
    directive: str | None

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)} line {self.line} ({self.lang or 'no language'})"

    @property
    def runs_here(self) -> bool:
        return self.lang in RUNNABLE and self.directive is None


def snippets(doc: Path) -> list[Snippet]:
    text = doc.read_text()
    return [Snippet(doc, text.count("\n", 0, m.start("body")), m.group("lang"),
                    re.sub(rf"^{m.group('indent')}", "", m.group("body"), flags=re.M), m.group("directive"))
            for m in BLOCK.finditer(text)]


ALL = [s for doc in DOCS for s in snippets(doc)]


def test_every_snippet_says_its_language_and_is_run_here_or_by_the_test_it_names():
    assert len(ALL) > 30
    for s in ALL:
        assert s.lang in LANGUAGES, f"{s.where()}: a block says its language, one of {sorted(LANGUAGES)}"
        if s.lang == "js":
            assert s.directive is not None, f"{s.where()}: a js block names the test that runs it"
        if s.lang not in RUNNABLE | {"js"} or s.directive is None:
            continue
        if s.directive.startswith("quickstart:"):
            assert s.doc.name == "security.md", s.where()
            continue
        m = re.fullmatch(r"docs-test: skip \((?P<why>.+)\)", s.directive, re.S)
        assert m is not None, f"{s.where()}: unknown directive {s.directive!r}"
        named = NAMED.findall(m["why"])
        assert named, f"{s.where()}: a skipped snippet names the test or benchmark that runs it: {m['why']!r}"
        for path, test in named:
            assert (ROOT / path).is_file(), f"{s.where()}: {path} does not exist"
            if test:
                assert re.search(rf"^(async )?def {test}\(", (ROOT / path).read_text(), re.M), \
                    f"{s.where()}: no test {test} in {path}"


# ------------------------------------------------------------------------------ command lines

def command_lines(body: str) -> list[list[str]]:
    """The words after `oncelog` (or `.venv/bin/oncelog`) on each line of a shell snippet, up to
    a pipe or redirection; `$(...)` and `${...}` become one word, `...` placeholders are dropped."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = re.sub(r"\$\((?:[^()]|\([^()]*\))*\)|\$\{[^}]*\}", "X", line)
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            raise AssertionError(f"{line!r}: {e}") from None
        for i, word in enumerate(words):
            if word == "oncelog" or word.endswith("/bin/oncelog"):
                argv = []
                for w in words[i + 1:]:
                    if w in ("|", "||", "&&", ";", "&") or re.match(r"\d?[<>]", w):
                        break
                    if w != "...":
                        argv.append(w)
                out.append(argv)
                break
    return out


# a wrong command and a wrong option, to show the check finds them (asked in the same process)
PLANTED = "oncelog topic lst\n.venv/bin/oncelog consume t --offest start | head\noncelog topic list\n"


def test_every_oncelog_command_line_in_a_snippet_parses():
    readme = [s for s in snippets(ROOT / "README.md") if s.lang == "sh"]
    lines = [(s, argv) for s in [*ALL, *readme] if s.lang == "sh" for argv in command_lines(s.body)]
    assert len(lines) > 30
    planted = command_lines(PLANTED)
    assert planted == [["topic", "lst"], ["consume", "t", "--offest", "start"], ["topic", "list"]]
    _tree, errors = ask([*planted, *(argv for _s, argv in lines)])
    assert "No such command 'lst'" in errors[0] and "No such option '--offest'" in errors[1] and errors[2] is None
    wrong = [f"{s.where()}: oncelog {shlex.join(argv)}: {error}" for (s, argv), error in zip(lines, errors[3:])
             if error is not None]
    assert not wrong, "\n".join(wrong)


SERVE_SHORTCUTS = {"--listeners": "listeners", "--advertised-listeners": "advertised.listeners",
                   "--log-dirs": "log.dirs", "--controller-listener": "controller.listener"}


def test_the_settings_given_on_command_lines_are_known(caplog):
    """`serve --override NAME=VALUE` names a broker setting oncelog takes (it would log and ignore
    another), `produce -X NAME=VALUE` a producer setting."""
    readme = [s for s in snippets(ROOT / "README.md") if s.lang == "sh"]
    argvs = [argv for s in [*ALL, *readme] if s.lang == "sh" for argv in command_lines(s.body)]
    served = []
    with caplog.at_level(logging.WARNING, logger="oncelog.broker"):
        for argv in argvs:
            pairs = zip(argv, argv[1:]) if argv[0] == "serve" else ()
            overrides = dict(value.split("=", 1) if option == "--override" else (SERVE_SHORTCUTS[option], value)
                             for option, value in pairs if option == "--override" or option in SERVE_SHORTCUTS)
            if overrides:
                BrokerConfig(overrides)
                served.append(overrides)
            for option, value in zip(argv, argv[1:]):
                if argv[0] == "produce" and option in ("-X", "--producer-property"):
                    config_keys.check(dict([value.split("=", 1)]), "producer")
    assert len(served) >= 5
    assert not [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]


# ------------------------------------------------------------------------------ properties

def test_properties_blocks_are_settings_oncelog_takes(caplog):
    blocks = [s for s in ALL if s.lang == "properties"]
    assert len(blocks) >= 3
    for s in blocks:
        raw = parse_properties(s.body, s.where())
        if "bootstrap.servers" in raw or "security.protocol" in raw:   # a client's --command-config file
            config_keys.check(client_settings(raw), "admin")
            continue
        with caplog.at_level(logging.WARNING, logger="oncelog.broker"):
            caplog.clear()
            BrokerConfig(raw)
        assert not [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()], s.where()


# ------------------------------------------------------------------------------ the runs

@pytest.mark.processes
def test_the_snippets_without_a_directive_run_as_written(shared_broker, tmp_path):
    runs = [s for s in ALL if s.runs_here]
    assert runs, "no docs snippet runs here"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "ONCELOG_BOOTSTRAP_SERVER": shared_broker.bootstrap,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for s in runs:
        body = s.body.replace("127.0.0.1:9092", shared_broker.bootstrap)
        argv = ["bash", "-e", "-o", "pipefail", "-c", body] if s.lang == "sh" else [sys.executable, "-c", body]
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{s.where()} failed ({r.returncode}):\n{body}\n--- stdout\n{r.stdout[-2000:]}" \
                                  f"\n--- stderr\n{r.stderr[-3000:]}"
