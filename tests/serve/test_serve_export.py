"""`aiayn serve --model EXPORT`: a CTranslate2 or ONNX export behind the same API (issue 22):
what is served equals the export's own translator, the limits and errors are the same, and
`/v1/explain` says there is nothing to trace while the page still translates."""

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (aiayn[export])")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (aiayn[export])")
pytest.importorskip("onnxscript", reason="onnxscript is not installed (aiayn[export])")
import httpx
import torch
from serving import ServerProcess

from aiayn.interop.engines import load_translator

LINES = ["forty-two", "seven hundred and one", "eleven", "three thousand and nine"]


@pytest.fixture(scope="module")
def exports(served_model_dir, tmp_path_factory):
    from aiayn.interop.export_ct2 import export_ctranslate2
    from aiayn.interop.export_onnx import export_onnx

    root = tmp_path_factory.mktemp("exports")
    return {"ctranslate2": export_ctranslate2(served_model_dir, root / "ct2", "int8"),
            "onnxruntime": export_onnx(served_model_dir, root / "onnx")}  # fmt: skip


@pytest.mark.parametrize("engine", ["ctranslate2", "onnxruntime"])
def test_an_export_is_served_as_its_engine_translates(exports, engine):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = load_translator(exports[engine], device="cpu", threads=1)
        want = [r[0].text for r in local.translate_hyps(LINES, local.settings(beam=2))]
    finally:
        torch.set_num_threads(before)
    s = ServerProcess(exports[engine])
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            info = c.get("/v1/model").json()
            assert info["engine"].startswith(engine) and info["traceable"] is False
            assert info["languages"] == {"source": "en", "target": "de"}  # from its source
            got = c.post("/v1/translate", json={"q": LINES, "beam": 2}).json()
            assert [t["text"] for t in got["translations"]] == want
            r = c.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"})
            assert r.status_code == 200 and r.json()["translatedText"] == want[0]
            r = c.post("/v1/explain", json={"q": "two"})
            assert r.status_code == 409 and "nothing to trace" in r.json()["error"]
            r = c.post("/v1/translate", json={"q": "two", "beam": 99})
            assert r.status_code == 422  # the same limits
            assert c.get("/").status_code == 200
            if engine == "ctranslate2":  # CTranslate2 cannot reproduce aiayn's sample streams
                r = c.post("/v1/translate", json={"q": "two", "sample": True})
                assert r.status_code == 422 and "CTranslate2" in r.json()["error"]
    finally:
        assert s.stop()[0] == 0
