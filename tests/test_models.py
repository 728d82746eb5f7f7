"""Model manifests, verification, directory installs and hub fetches (against a local hub)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rinwa_index.cli import cli
from rinwa_index.embedder import OnnxEmbedder
from rinwa_index.errors import ChecksumMismatchError, ModelError, ModelNotInstalledError
from rinwa_index.fetch import fetch_model, progress_class
from rinwa_index.models import (
    BUILTIN,
    DEFAULT_MODEL,
    EMBEDDINGGEMMA,
    INSTALL_RECORD,
    MANIFEST_FILE,
    MINILM,
    Manifest,
    ModelFile,
    file_path,
    get_manifest,
    install_from_dir,
    list_models,
    load_tokenizer,
    manifest_from_dict,
    read_install_record,
    verified_path,
    verify_model,
)

from .hubserver import FakeHub, HubFile, HubServer
from .tinymodel import write_model_dir

REVISION = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/minilm-test"
MODEL_BYTES = file_path(MINILM, MINILM.file("model"), Path(".")).read_bytes()
TOKENIZER_BYTES = file_path(MINILM, MINILM.file("tokenizer"), Path(".")).read_bytes()


def hub_manifest(*, pinned: bool = False, name: str = "minilm-hub") -> Manifest:
    """The default model's files as a made-up hub repository at a made-up revision."""
    digests = {"model": MINILM.file("model").sha256, "tokenizer": MINILM.file("tokenizer").sha256}
    return dataclasses.replace(
        MINILM,
        name=name,
        source="hub",
        repo=REPO,
        revision=REVISION,
        files=(
            ModelFile("model", "onnx/model.onnx", digests["model"] if pinned else ""),
            ModelFile("tokenizer", "tokenizer.json", digests["tokenizer"] if pinned else ""),
        ),
    )


def fake_hub(**faults: object) -> FakeHub:
    files = {"onnx/model.onnx": HubFile(MODEL_BYTES), "tokenizer.json": HubFile(TOKENIZER_BYTES)}
    return FakeHub(REPO, REVISION, files, **faults)  # type: ignore[arg-type]


def gets(hub: FakeHub, name: str) -> list[str]:
    return [r for m, p, r in hub.requests if m == "GET" and p.endswith(name)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- manifests ------------------------------------------------------------------


def test_default_and_builtins() -> None:
    assert get_manifest() is MINILM
    assert MINILM.name == DEFAULT_MODEL
    gemma = get_manifest("embeddinggemma-300m")
    assert gemma.repo == "onnx-community/embeddinggemma-300m-ONNX"
    assert gemma.revision == "5090578d9565bb06545b4552f76e6bc2c93e4a66"
    assert [f.path for f in gemma.files] == [
        "onnx/model_q4.onnx",
        "onnx/model_q4.onnx_data",
        "tokenizer.json",
    ]
    assert all(len(f.sha256) == 64 for f in gemma.files)
    assert (gemma.output, gemma.raw_dim, gemma.dim, gemma.max_tokens) == (
        "sentence_embedding", 768, 256, 512,
    )  # fmt: skip
    assert gemma.doc_prefix == "title: none | text: "
    assert gemma.query_prefix == "task: search result | query: "


def test_unknown_model_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="minilm-l6-int8"):
        get_manifest("nope")
    with pytest.raises(ModelError, match="choose one of"):
        get_manifest("nope", tmp_path)


def test_manifest_round_trips_through_json() -> None:
    data = json.loads(json.dumps(EMBEDDINGGEMMA.to_dict()))
    again = manifest_from_dict(data, source="hub")
    assert dataclasses.replace(again, extra={}) == EMBEDDINGGEMMA


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Bad Name"}, "lower-case"),
        ({"dim": 1024}, "dim must be between"),
        ({"output": "logits"}, "output must be"),
        ({"pooling": "mean"}, "needs pooling 'none'"),
        ({"onnx_inputs": ["input_ids"]}, "attention_mask"),
        ({"batch_tokens": 4}, "batch_tokens"),
        ({"files": [{"role": "model", "path": "../x.onnx", "sha256": "0" * 64}]}, "relative"),
        ({"files": [{"role": "model", "path": "m.onnx", "sha256": "abc"}]}, "SHA-256"),
        ({"files": [{"role": "model", "path": "m.onnx", "sha256": "0" * 64}]}, "tokenizer"),
        ({"raw_dim": None}, "wrong type"),
    ],
)
def test_invalid_manifests_are_rejected(tmp_path: Path, change: dict, message: str) -> None:
    data = json.loads((write_model_dir(tmp_path / "src") / MANIFEST_FILE).read_text())
    data.update(change)
    with pytest.raises(ModelError, match=message):
        manifest_from_dict(data)


def test_missing_field_is_named() -> None:
    with pytest.raises(ModelError, match="'max_tokens' is missing"):
        manifest_from_dict({"name": "x", "files": [], "raw_dim": 3})


# --- verification: a modified file is never loaded -------------------------------------


def test_default_model_verifies_from_its_packages(tmp_path: Path) -> None:
    verify_model(MINILM, tmp_path)
    statuses = {s.name: s for s in list_models(tmp_path)}
    assert statuses[MINILM.name].verified and statuses[MINILM.name].default
    assert not statuses["embeddinggemma-300m"].installed
    assert list_models(tmp_path)[0].name == DEFAULT_MODEL


def test_a_package_file_with_another_digest_is_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime

    opened: list[object] = []
    monkeypatch.setattr(onnxruntime, "InferenceSession", lambda *a, **k: opened.append(a))
    other = dataclasses.replace(MINILM.file("model"), sha256="f" * 64)
    tampered = dataclasses.replace(MINILM, files=(other, MINILM.file("tokenizer")))
    with pytest.raises(ChecksumMismatchError, match="does not match its pinned SHA-256"):
        verified_path(tampered, "model", tmp_path)
    with pytest.raises(ChecksumMismatchError):
        OnnxEmbedder(tampered, tmp_path)
    assert opened == []
    bad_tok = dataclasses.replace(MINILM.file("tokenizer"), sha256="e" * 64)
    with pytest.raises(ChecksumMismatchError):
        load_tokenizer(dataclasses.replace(MINILM, files=(MINILM.file("model"), bad_tok)), tmp_path)


def test_missing_package_is_reported_as_not_installed(tmp_path: Path) -> None:
    entry = dataclasses.replace(MINILM.file("model"), package="no-such-distribution-xyz")
    manifest = dataclasses.replace(MINILM, files=(entry, MINILM.file("tokenizer")))
    with pytest.raises(ModelNotInstalledError, match="reinstall rinwa-index"):
        verify_model(manifest, tmp_path)


# --- install --from DIR -------------------------------------------------------------


def test_install_from_dir_verifies_copies_and_lists(tmp_path: Path) -> None:
    src = write_model_dir(tmp_path / "src")
    models = tmp_path / "models"
    manifest = install_from_dir(src, models)
    assert manifest.source == "directory" and manifest.dim == 256
    assert sorted(p.name for p in (models / "tiny-768").iterdir()) == [
        "model.onnx", "rinwa-model.json", "tokenizer.json",
    ]  # fmt: skip
    assert get_manifest("tiny-768", models) == manifest
    status = {s.name: s for s in list_models(models)}["tiny-768"]
    assert (status.installed, status.verified, status.default) == (True, True, False)
    assert not (models / ".staging").exists() or not any((models / ".staging").iterdir())


def test_install_refuses_a_file_that_does_not_match(tmp_path: Path) -> None:
    src = write_model_dir(tmp_path / "src")
    with (src / "model.onnx").open("ab") as handle:
        handle.write(b"\0")
    models = tmp_path / "models"
    with pytest.raises(ChecksumMismatchError, match=r"model\.onnx of model tiny-768"):
        install_from_dir(src, models)
    assert not (models / "tiny-768").exists()
    assert "tiny-768" not in {s.name for s in list_models(models)}


def test_install_refuses_builtin_names_and_missing_files(tmp_path: Path) -> None:
    src = write_model_dir(tmp_path / "a", name=MINILM.name)
    with pytest.raises(ModelError, match="built-in"):
        install_from_dir(src, tmp_path / "models")
    src = write_model_dir(tmp_path / "b")
    (src / "tokenizer.json").unlink()
    with pytest.raises(ModelNotInstalledError, match="missing"):
        install_from_dir(src, tmp_path / "models")
    with pytest.raises(ModelError, match=r"No rinwa-model\.json"):
        install_from_dir(tmp_path, tmp_path / "models")


def test_a_modified_installed_copy_is_never_loaded(tmp_path: Path) -> None:
    models = tmp_path / "models"
    manifest = install_from_dir(write_model_dir(tmp_path / "src"), models)
    target = models / "tiny-768" / "model.onnx"
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError):
        OnnxEmbedder(manifest, models)
    status = {s.name: s for s in list_models(models)}["tiny-768"]
    assert status.installed and not status.verified and "model.onnx" in status.problem


def test_reinstalling_replaces_the_previous_copy(tmp_path: Path) -> None:
    models = tmp_path / "models"
    install_from_dir(write_model_dir(tmp_path / "one", seed=1), models)
    second = install_from_dir(write_model_dir(tmp_path / "two", seed=2), models)
    assert get_manifest("tiny-768", models) == second
    verify_model(second, models)


# --- the CLI ---------------------------------------------------------------------------


def run_cli(tmp_path: Path, *args: str) -> Result:
    env = {"RINWA_MODEL_DIR": str(tmp_path / "models"), "RINWA_DB": str(tmp_path / "x.db")}
    return CliRunner().invoke(cli, list(args), env=env)


def test_cli_model_list_json_shape(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "model", "list", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {"name", "installed", "verified", "default", "dim", "max_tokens"} <= set(rows[0])
    assert rows[0] == {**rows[0], "name": MINILM.name, "default": True, "verified": True}
    assert {r["name"] for r in rows} == set(BUILTIN)


def test_cli_install_verify_and_mismatch(tmp_path: Path) -> None:
    src = write_model_dir(tmp_path / "src")
    result = run_cli(tmp_path, "model", "install", "--from", str(src))
    assert result.exit_code == 0, result.output
    assert "Installed and verified tiny-768" in result.output
    assert run_cli(tmp_path, "model", "verify", "tiny-768").exit_code == 0
    listed = json.loads(run_cli(tmp_path, "model", "list", "--json").output)
    assert {"name": "tiny-768", "installed": True, "verified": True}.items() <= next(
        r for r in listed if r["name"] == "tiny-768"
    ).items()

    (tmp_path / "models" / "tiny-768" / "tokenizer.json").write_text("{}")
    result = run_cli(tmp_path, "model", "verify", "tiny-768")
    assert result.exit_code == 1
    assert "tokenizer.json of model tiny-768 does not match its pinned SHA-256" in result.output
    result = run_cli(tmp_path, "model", "verify")
    assert result.exit_code == 1 and "tiny-768 did not verify" in result.output


def test_cli_verify_and_fetch_report_clear_errors(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "model", "verify", "embeddinggemma-300m")
    assert result.exit_code == 1 and "model fetch embeddinggemma-300m" in result.output
    result = run_cli(tmp_path, "model", "fetch", MINILM.name, "--yes")
    assert result.exit_code == 1 and "not fetched from the hub" in result.output
    result = run_cli(tmp_path, "model", "fetch", "embeddinggemma-300m")  # no TTY, no --yes
    assert result.exit_code == 1 and "pass --yes" in result.output
    assert run_cli(tmp_path, "model", "install").exit_code == 2  # usage: --from is required


# --- fetch from the hub (a local server speaking its protocol) -------------------------------


def test_fetch_downloads_verifies_records_and_reports_progress(tmp_path: Path) -> None:
    hub, out = fake_hub(), io.StringIO()
    with HubServer(hub) as server:
        fetched = fetch_model(hub_manifest(), tmp_path, endpoint=server.endpoint, progress=out)
    record = json.loads((tmp_path / "minilm-hub" / INSTALL_RECORD).read_text())
    assert record["revision"] == REVISION
    assert record["files"]["onnx/model.onnx"] == MINILM.file("model").sha256
    assert fetched.file("model").sha256 == MINILM.file("model").sha256
    assert read_install_record(hub_manifest(), tmp_path) == record["files"]
    verify_model(hub_manifest(), tmp_path)  # the recorded digests make it verifiable
    lines = out.getvalue().splitlines()
    assert "minilm-hub: onnx/model.onnx 100% (22.9 of 22.9 MB)" in lines
    assert lines[-1] == "minilm-hub: installed and verified (2 files)."
    assert "\r" not in out.getvalue()  # plain lines when the stream is not a terminal
    assert sorted(p.name for p in (tmp_path / "minilm-hub").rglob("*")) == [
        "model.onnx", "onnx", "rinwa-install.json", "tokenizer.json",
    ]  # fmt: skip
    embedder = OnnxEmbedder(fetched, tmp_path)
    assert embedder.embed_query("hello").shape == (384,)


def test_progress_is_a_tqdm_bar_on_a_terminal_and_silent_without_a_stream() -> None:
    out = io.StringIO()
    bar = progress_class(out, label="m: f.onnx", tty=True)(total=2_000_000, unit="B")
    bar.update(2_000_000)
    bar.close()
    assert "m: f.onnx" in out.getvalue() and "100%" in out.getvalue() and "\r" in out.getvalue()
    silent = progress_class(None, label="m: f.onnx")(total=10)
    silent.update(10)
    silent.close()


def test_fetch_again_is_a_no_op_even_offline(tmp_path: Path) -> None:
    with HubServer(fake_hub()) as server:
        fetch_model(hub_manifest(pinned=True), tmp_path, endpoint=server.endpoint)
    out = io.StringIO()
    dead = f"http://127.0.0.1:{free_port()}"
    fetch_model(hub_manifest(pinned=True), tmp_path, endpoint=dead, progress=out)
    assert "already installed and verified" in out.getvalue()


def test_a_tampered_download_is_refused_and_a_rerun_recovers(tmp_path: Path) -> None:
    hub = fake_hub()
    lie = bytearray(MODEL_BYTES)
    lie[1000] ^= 0xFF
    hub.files["onnx/model.onnx"].served = bytes(lie)  # announces the true digest, sends others
    with HubServer(hub) as server:
        with pytest.raises(ChecksumMismatchError, match="does not match its SHA-256"):
            fetch_model(hub_manifest(), tmp_path, endpoint=server.endpoint)
        assert not (tmp_path / "minilm-hub").exists()
        assert not list((tmp_path / ".staging").rglob("model.onnx"))  # deleted, never kept
        with pytest.raises(ModelError):
            OnnxEmbedder(hub_manifest(), tmp_path)
        hub.files["onnx/model.onnx"].served = None
        fetch_model(hub_manifest(), tmp_path, endpoint=server.endpoint)
    verify_model(hub_manifest(), tmp_path)


def test_a_hub_disagreeing_with_the_pin_is_refused_before_downloading(tmp_path: Path) -> None:
    hub = fake_hub()
    hub.files["tokenizer.json"] = HubFile(TOKENIZER_BYTES + b" ")
    with HubServer(hub) as server, pytest.raises(ChecksumMismatchError, match="another SHA-256"):
        fetch_model(hub_manifest(pinned=True), tmp_path, endpoint=server.endpoint)
    assert not [r for r in hub.requests if r[0] == "GET"]
    assert not (tmp_path / "minilm-hub").exists()


def test_a_cut_transfer_resumes_within_the_call(tmp_path: Path) -> None:
    hub = fake_hub(cut_once={"onnx/model.onnx"})
    with HubServer(hub) as server:
        fetch_model(hub_manifest(pinned=True), tmp_path, endpoint=server.endpoint)
    assert gets(hub, "model.onnx")[0] == "" and gets(hub, "model.onnx")[1].startswith("bytes=")
    verify_model(hub_manifest(pinned=True), tmp_path)


def test_an_interrupted_fetch_installs_nothing_and_a_rerun_completes(tmp_path: Path) -> None:
    hub = fake_hub(cut_once={"tokenizer.json"}, down_after_cut=True)
    with HubServer(hub) as server:
        with pytest.raises(ModelError, match="re-run `rinwa-index model fetch minilm-hub`"):
            fetch_model(hub_manifest(), tmp_path, endpoint=server.endpoint)
        assert not (tmp_path / "minilm-hub").exists()
        with pytest.raises(ModelNotInstalledError):
            OnnxEmbedder(hub_manifest(), tmp_path)
        hub.down = False
        out = io.StringIO()
        fetch_model(hub_manifest(), tmp_path, endpoint=server.endpoint, progress=out)
    assert "minilm-hub: onnx/model.onnx already downloaded." in out.getvalue()
    assert len(gets(hub, "model.onnx")) == 1  # the finished file was kept, not fetched again
    assert len(gets(hub, "tokenizer.json")) == 3  # cut, refused retry, then whole
    verify_model(hub_manifest(), tmp_path)


def test_a_wrong_file_left_by_a_killed_run_is_fetched_again(tmp_path: Path) -> None:
    staged = tmp_path / ".staging" / f"fetch-minilm-hub-{REVISION[:12]}"
    (staged / "onnx").mkdir(parents=True)
    (staged / "onnx" / "model.onnx").write_bytes(MODEL_BYTES[:1000])
    (staged / ".cache" / "huggingface").mkdir(parents=True)
    hub = fake_hub()
    with HubServer(hub) as server:
        fetch_model(hub_manifest(), tmp_path, endpoint=server.endpoint)
    assert len(gets(hub, "model.onnx")) == 1
    verify_model(hub_manifest(), tmp_path)


def test_a_hub_that_is_down_fails_fast_with_a_clear_error(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(ModelError, match=r"Could not download model minilm-hub from http://127"):
        fetch_model(hub_manifest(), tmp_path, endpoint=f"http://127.0.0.1:{free_port()}")
    assert time.monotonic() - start < 5
    assert not (tmp_path / "minilm-hub").exists()


def test_a_fetched_file_modified_later_is_never_loaded(tmp_path: Path) -> None:
    with HubServer(fake_hub()) as server:
        fetch_model(hub_manifest(), tmp_path, endpoint=server.endpoint)
    (tmp_path / "minilm-hub" / "tokenizer.json").write_bytes(TOKENIZER_BYTES[:-1])
    with pytest.raises(ChecksumMismatchError):
        OnnxEmbedder(hub_manifest(), tmp_path)
    record = tmp_path / "minilm-hub" / INSTALL_RECORD
    record.write_text(record.read_text().replace(REVISION, "f" * 40))
    with pytest.raises(ChecksumMismatchError, match="no pinned or recorded SHA-256"):
        verify_model(hub_manifest(), tmp_path)  # a record of another revision vouches for nothing


def test_cli_fetch_uses_the_endpoint_and_refuses_wrong_files(tmp_path: Path) -> None:
    """The real command, in a fresh process: endpoint from the environment, no telemetry."""
    gemma = EMBEDDINGGEMMA
    files = {f.path: HubFile(b"not the real file " + f.path.encode()) for f in gemma.files}
    hub = FakeHub(gemma.repo, gemma.revision, files)
    env = {
        **os.environ,
        "RINWA_MODEL_DIR": str(tmp_path / "models"),
        "RINWA_HF_ENDPOINT": "",
        "HF_HUB_DISABLE_TELEMETRY": "",
    }
    code = (
        "import os, sys, runpy; sys.argv = ['rinwa-index', 'model', 'fetch', "
        "'embeddinggemma-300m', '--yes'];\n"
        "try: runpy.run_module('rinwa_index', run_name='__main__')\n"
        "finally: print('TELEMETRY=' + os.environ.get('HF_HUB_DISABLE_TELEMETRY', ''))"
    )
    with HubServer(hub) as server:
        env["RINWA_HF_ENDPOINT"] = server.endpoint
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 1, result.stderr
    assert "another SHA-256" in result.stderr and "nothing was installed" in result.stderr
    assert "TELEMETRY=1" in result.stdout
    assert hub.requests and hub.requests[0][1].startswith(
        f"/{gemma.repo}/resolve/{gemma.revision}/"
    )
    assert not (tmp_path / "models" / gemma.name).exists()
