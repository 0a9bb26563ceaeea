"""llama.cpp's own server test suite (their ``tools/server/tests``, from the pinned
llama-cpp-python sdist) against ``igi-sdk serve --http``, through a ``llama-server`` stand-in:
every test of the chosen files ends as ``tests/llamacpp_server/expected.txt`` says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.llamacpp_server import suite
from tests.llamacpp_server.expectations import OUTCOMES, load, match, parse
from tests.llamacpp_server.llama_server import Refused, translate

ROOT = Path(__file__).resolve().parents[1]


def test_the_sdist_is_the_pinned_llama_cpp_python() -> None:
    pins = (ROOT / "pyproject.toml").read_text()
    # a new pin needs its tests' digest too (suite.SDIST_SHA256)
    assert f'"{suite.PACKAGE}=={suite.VERSION}"' in pins


def test_expected_list_is_well_formed() -> None:
    expected = load(suite.EXPECTED)
    assert {e.outcome for e in expected.values()} <= set(OUTCOMES)
    for key, exp in expected.items():
        assert key.split("::")[0] in suite.FILES, key
        assert exp.outcome == "pass" or exp.reason, key


def test_expectations_format() -> None:
    text = ("[pass]\nunit/a.py::t1\n"
            "[partial] `x == 1` their model's count\nunit/a.py::t2\n"
            "[skip] theirs only\nunit/a.py::t3*\nunit/a.py::t3[b]\n"
            "[incompatible] why\n# a comment\nunit/a.py::t3[a]\n")
    exp = parse(text)
    assert match(exp, "unit/a.py::t2").at == "x == 1"  # type: ignore[union-attr]
    assert match(exp, "unit/a.py::t3[a]").outcome == "incompatible"  # type: ignore[union-attr]
    assert match(exp, "unit/a.py::t3[c]").outcome == "skip"  # type: ignore[union-attr]
    assert match(exp, "unit/a.py::t4") is None
    for bad in ("unit/a.py::t1\n", "[maybe] x\nunit/a.py::t\n", "[skip]\nunit/a.py::t\n",
                "[partial] no piece\nunit/a.py::t\n", "[pass]\nunit/a.py::t\nunit/a.py::t\n"):
        with pytest.raises(ValueError):
            parse(bad)


def test_compare_holds_the_list_true() -> None:
    exp = parse("[pass]\nu.py::p\n[partial] `fingerprint` theirs\nu.py::q\nu.py::r\nu.py::s\n"
                "[incompatible] why\nu.py::i\n[skip] theirs\nu.py::k\n")
    outcomes = {"u.py::p": "failed", "u.py::q": "failed", "u.py::r": "failed",
                "u.py::s": "passed", "u.py::i": "passed", "u.py::k": "skipped",
                "u.py::new": "passed"}
    where = {"u.py::q": ["assert res.status_code == 200", "assert 'fingerprint' in body"],
             "u.py::r": ["assert res.status_code == 200"]}
    problems = suite.compare(outcomes, where, exp)
    text = "\n".join(problems)
    assert "expected to pass, failed: u.py::p" in text
    assert "u.py::q" not in text  # failed where it was expected to
    assert "failed earlier at `assert res.status_code == 200`: u.py::r" in text
    assert "passed (move it to [pass]): u.py::s" in text
    assert "now passes (move it to [pass]): u.py::i" in text
    assert "not in expected.txt (passed): u.py::new" in text
    assert len(problems) == 5


def test_stand_in_translates_llama_server_arguments(tmp_path: Path) -> None:
    args = translate(["--port", "8123", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1",
                      "--hf-repo", "ggml-org/test-model-stories260K", "--batch-size", "32",
                      "--no-slots", "--alias", "tinyllama-2", "--ctx-size", "512",
                      "--parallel", "2", "--n-predict", "64", "--api-key", "sk-0123456789abcdef",
                      "--no-jinja"], tmp_path)
    assert args[:3] == ["serve", "--http", "127.0.0.1:8123"]
    assert args[args.index("--ctx") + 1] == "512"
    assert args[args.index("--max-sessions") + 1] == "2"
    assert args[args.index("--session-ctx") + 1] == "256"  # llama-server's per-slot context
    key_file = Path(args[args.index("--api-key-file") + 1])
    assert key_file.read_text() == "sk-0123456789abcdef"
    assert key_file.stat().st_mode & 0o077 == 0  # the key is readable by its owner only
    assert "sk-0123456789abcdef" not in args  # never on a command line
    # llama-server refuses a prompt over its context unless --context-shift is given
    assert args[args.index("--http-memory") + 1] == "off"
    shifted = translate(["--context-shift", "--port", "8123"], tmp_path)
    assert shifted[shifted.index("--http-memory") + 1] == "fold"
    for refused in (["--lora", "x.gguf"], ["--host", "127.0.0.1,::1"], ["--frobnicate", "1"]):
        with pytest.raises(Refused):
            translate(refused, tmp_path)


@pytest.mark.slow
def test_llamacpp_server_suite() -> None:
    """Their OpenAI-facing tests in one pytest process, a sidecar started per test as their
    suite starts llama-server: every outcome as expected.txt says."""
    try:
        report = suite.run()
    except suite.FetchError as e:  # CI has PyPI; no network is a failure, not a skip
        pytest.fail(str(e))
    expected = load(suite.EXPECTED)
    print(report.summary(expected))
    assert report.outcomes, "their pytest ran no test"
    assert not report.problems, "\n".join(report.problems)
    # every test the list expects to run ran, none was skipped by surprise
    ran = {k for k, v in report.outcomes.items() if v != "skipped"}
    wanted = {k for k in report.outcomes
              if (m := match(expected, k)) is not None and m.outcome != "skip"}
    assert ran == wanted
