"""A classifier's `aiayn serve` fuzzed from its own /openapi.json with schemathesis (every check,
as tests/serve/test_serve_fuzz.py runs on a translator's), on the tiny classifier that
test_classify_serve trains."""

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install .[test])")

from .test_classify_serve import cls_dir  # noqa: F401  (the module fixture: the model fuzzed)
from .test_serve_fuzz import fuzz


def test_schemathesis_finds_nothing_on_a_classifier_server(cls_dir, tmp_path):  # noqa: F811
    result = fuzz(cls_dir, tmp_path, 8, "--max-sentences", "16")
    # /health, /v1/model, /v1/explain/seed, /v1/classify, /v1/explain/classify
    assert result["operations"]["tested"] == 5
    assert result["test_cases"]["with_failures"] == 0 and not result["errors"]


@pytest.mark.slow
def test_schemathesis_finds_nothing_in_1000_cases_on_a_classifier_server(
    cls_dir,  # noqa: F811
    tmp_path,
):
    result = fuzz(cls_dir, tmp_path, 500)  # the GETs take no input: the two POSTs' cases
    assert result["test_cases"]["generated"] >= 1000
    assert result["test_cases"]["with_failures"] == 0 and not result["errors"]
