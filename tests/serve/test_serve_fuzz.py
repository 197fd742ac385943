"""`aiayn serve` fuzzed from its own /openapi.json with schemathesis (every check: no 5xx,
documented status codes and content types, responses that match their schemas, schema-valid
requests accepted and schema-violating ones refused), against a real server subprocess.

The default run is bounded to fit the CI budget; the `slow` run generates over 2,000 cases.
"""

import json
import subprocess
import sys

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install .[test])")
from serving import ServerProcess

KEY = "fuzz-key"


def fuzz(model_dir, tmp_path, examples: int, *flags: str) -> dict:
    """Run schemathesis with `examples` per operation; its JSON report."""
    s = ServerProcess(model_dir, "--max-output-tokens", "32", "--api-key", KEY, *flags)
    report = tmp_path / "schemathesis.json"
    try:
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"{s.url}/openapi.json",
             "--checks", "all", "--max-examples", str(examples), "--seed", "19",
             "--header", f"Authorization: Bearer {KEY}", "--request-timeout", "60",
             "--no-color", "--report", "json", "--report-json-path", str(report)],
            capture_output=True, text=True, timeout=1800,
            cwd=tmp_path,  # schemathesis keeps a cache in its working directory: not the repo
        )  # fmt: skip
    finally:
        _, _, err = s.stop()
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "Traceback" not in err, err[-4000:]  # the server logged no unexpected error
    result = json.loads(report.read_text())
    cases = result["test_cases"]
    print(
        f"schemathesis: {cases['generated']} cases, {cases['with_failures']} failing, "
        f"{result['running_time']:.0f} s"
    )  # shown with pytest -s (the figure docs quote)
    return result


def test_schemathesis_finds_nothing(served_model_dir, tmp_path):
    result = fuzz(served_model_dir, tmp_path, 8)
    assert result["operations"]["tested"] == 8  # every operation has a schema to fuzz
    assert result["test_cases"]["generated"] >= 200
    assert result["test_cases"]["with_failures"] == 0 and not result["errors"]


@pytest.mark.slow
def test_schemathesis_finds_nothing_in_2000_cases(served_model_dir, tmp_path):
    result = fuzz(served_model_dir, tmp_path, 350)
    assert result["test_cases"]["generated"] >= 2000
    assert result["test_cases"]["with_failures"] == 0 and not result["errors"]
