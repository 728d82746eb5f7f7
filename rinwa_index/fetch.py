"""``model fetch``: download a hub model at its pinned revision, verified, into the cache.

Only an explicit operator command calls this; nothing on the query or
indexing path downloads anything. The flow:

1. ``HEAD`` every file (no retries, so a hub that is down fails in well under a
   second) and learn the SHA-256 the hub announces for that revision
   (``X-Linked-Etag``). A pinned digest in the manifest must agree with it.
2. Download each file with huggingface-hub into a staging directory under the
   model cache (same file system). Files already staged by an interrupted run
   are kept when their digest matches and fetched again otherwise; a transfer
   cut mid-way is resumed by huggingface-hub with a ``Range`` request.
3. Hash every staged file (huggingface-hub checks only the size) and compare
   with the expected digest; a mismatch deletes that file and fails.
4. Write an install record with the digests, then move the directory into
   place with one rename: nothing half-installed is ever visible.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from .errors import ChecksumMismatchError, ModelError
from .models import (
    INSTALL_RECORD,
    STAGING_DIR,
    Manifest,
    ModelFile,
    ModelNotInstalledError,
    move_into_place,
    read_install_record,
    sha256_file,
    staging_dir,
    verify_model,
)

DEFAULT_ENDPOINT = "https://huggingface.co"

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_HF_METADATA = ".cache"  # where huggingface-hub keeps its bookkeeping inside ``local_dir``


@dataclass(frozen=True)
class RemoteFile:
    """A file as the hub describes it at the pinned revision."""

    entry: ModelFile
    sha256: str
    size: int | None


def fetch_model(
    manifest: Manifest,
    model_dir: Path,
    *,
    endpoint: str | None = None,
    progress: TextIO | None = None,
    tty: bool | None = None,
    timeout: float = 10.0,
) -> Manifest:
    """Download, verify and install ``manifest``'s files; return it with every digest known.

    ``endpoint`` is the hub's base URL (None: huggingface.co); the caller reads it
    from its configuration, because huggingface-hub reads ``HF_ENDPOINT`` only
    once, at import. ``progress`` receives a tqdm bar when ``tty`` (default:
    whether the stream is a terminal) and one plain line per quarter of each
    file otherwise; None is silent. Raises :class:`ModelError` (unreachable hub, HTTP error) or
    :class:`ChecksumMismatchError`; both leave the previous install untouched and a
    re-run picks up where this one stopped.
    """
    if manifest.source != "hub" or not manifest.repo:
        raise ModelError(
            f"Model {manifest.name} does not come from the hub, so there is nothing to fetch; "
            "see `rinwa-index model list`."
        )
    with contextlib.suppress(ModelError):
        verify_model(manifest, model_dir)
        _say(progress, f"{manifest.name}: already installed and verified.")
        return _recorded(manifest, model_dir)
    hub = _import_hub()
    endpoint = endpoint or DEFAULT_ENDPOINT
    model_dir.mkdir(parents=True, exist_ok=True)
    with _fetch_lock(model_dir, manifest.name):
        staged = staging_dir(model_dir, f"fetch-{manifest.name}-{manifest.revision[:12]}")
        shutil.rmtree(staged / _HF_METADATA, ignore_errors=True)  # partial blobs of a killed run
        with _hub_errors(hub, manifest, endpoint):
            remote = [
                _describe(hub, manifest, entry, endpoint, timeout) for entry in manifest.files
            ]
            for item in remote:
                _drop_if_stale(staged / item.entry.path, item.sha256)
            for item in remote:
                _download(hub, manifest, item, staged, endpoint, timeout, progress, tty)
        digests = _verify_staged(manifest, remote, staged)
        record = {"name": manifest.name, "repo": manifest.repo, "revision": manifest.revision}
        record["files"] = digests  # type: ignore[assignment]
        (staged / INSTALL_RECORD).write_text(json.dumps(record, indent=2), "utf-8")
        shutil.rmtree(staged / _HF_METADATA, ignore_errors=True)
        move_into_place(staged, model_dir, manifest.name)
    _say(progress, f"{manifest.name}: installed and verified ({len(digests)} files).")
    return manifest.with_digests(digests)


def _recorded(manifest: Manifest, model_dir: Path) -> Manifest:
    return manifest.with_digests(read_install_record(manifest, model_dir))


def _import_hub() -> ModuleType:
    # Telemetry is read once, at import: set before the first import so that
    # nothing but the explicit download leaves the machine.
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    import huggingface_hub
    import huggingface_hub.errors  # the package loads submodules lazily

    return huggingface_hub


@contextlib.contextmanager
def _fetch_lock(model_dir: Path, name: str) -> Iterator[None]:
    """One fetch per model at a time: two would share (and corrupt) one staging directory."""
    lock_path = model_dir / STAGING_DIR / f"fetch-{name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ModelError(
                f"Another `model fetch {name}` is running; wait for it to finish."
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _describe(
    hub: ModuleType, manifest: Manifest, entry: ModelFile, endpoint: str, timeout: float
) -> RemoteFile:
    """``HEAD`` one file: its announced SHA-256 and size, checked against the pins."""
    url = hub.hf_hub_url(manifest.repo, entry.path, revision=manifest.revision, endpoint=endpoint)
    # No retries here: a hub that is down must fail at once, not after ~23 s of backoff.
    meta = hub.get_hf_file_metadata(
        url, token=False, timeout=timeout, endpoint=endpoint, retry_on_errors=False
    )
    if _COMMIT_RE.match(manifest.revision) and meta.commit_hash != manifest.revision:
        raise ModelError(
            f"The hub served another revision of {manifest.repo} than the pinned "
            f"{manifest.revision}; check the hub endpoint."
        )
    announced = meta.etag if meta.etag and _SHA256_RE.match(meta.etag) else ""
    if entry.sha256 and announced and announced != entry.sha256:
        raise ChecksumMismatchError(
            f"The hub announces another SHA-256 for {entry.path} of model {manifest.name} than "
            "the pinned one; nothing was installed. Check the hub endpoint."
        )
    expected = entry.sha256 or announced
    if not expected:
        raise ModelError(
            f"The hub gives no SHA-256 for {entry.path} of model {manifest.name} and the manifest "
            "pins none, so it cannot be verified; pin its SHA-256 in the manifest."
        )
    if entry.size is not None and meta.size is not None and entry.size != meta.size:
        raise ChecksumMismatchError(
            f"The hub announces {meta.size} bytes for {entry.path} of model {manifest.name}, "
            f"not the pinned {entry.size}; nothing was installed. Check the hub endpoint."
        )
    return RemoteFile(entry, expected, meta.size)


def _drop_if_stale(path: Path, expected: str) -> None:
    """A file left by an earlier run is kept only if it is already the right one."""
    if path.is_file() and sha256_file(path) != expected:
        path.unlink()


def _download(
    hub: ModuleType,
    manifest: Manifest,
    item: RemoteFile,
    staged: Path,
    endpoint: str,
    timeout: float,
    progress: TextIO | None,
    tty: bool | None,
) -> None:
    label = f"{manifest.name}: {item.entry.path}"
    if (staged / item.entry.path).is_file():
        _say(progress, f"{label} already downloaded.")
        return
    hub.hf_hub_download(
        manifest.repo,
        item.entry.path,
        revision=manifest.revision,
        local_dir=staged,
        # Keep huggingface-hub away from the user's own hub cache: read nothing there.
        cache_dir=staged / _HF_METADATA / "hub",
        endpoint=endpoint,
        token=False,
        etag_timeout=timeout,
        tqdm_class=progress_class(progress, label=label, tty=tty),
    )


def _verify_staged(manifest: Manifest, remote: list[RemoteFile], staged: Path) -> dict[str, str]:
    digests: dict[str, str] = {}
    for item in remote:
        path = staged / item.entry.path
        if not path.is_file():
            raise ModelNotInstalledError(
                f"The download of {item.entry.path} did not complete; re-run "
                f"`rinwa-index model fetch {manifest.name}`."
            )
        actual = sha256_file(path)
        if actual != item.sha256:
            path.unlink()  # never kept, never loaded; a re-run downloads it again
            raise ChecksumMismatchError(
                f"The downloaded {item.entry.path} of model {manifest.name} does not match its "
                "SHA-256 and was deleted; nothing was installed. Re-run the fetch, and if it "
                "fails again check the hub endpoint."
            )
        digests[item.entry.path] = actual
    return digests


@contextlib.contextmanager
def _hub_errors(hub: ModuleType, manifest: Manifest, endpoint: str) -> Iterator[None]:
    """Turn huggingface-hub and network errors into one sentence that says what to do."""
    errors = hub.errors
    retry = f"re-run `rinwa-index model fetch {manifest.name}`; finished files are kept"
    try:
        yield
    except errors.OfflineModeIsEnabled:
        raise ModelError("HF_HUB_OFFLINE is set; unset it to fetch a model.") from None
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as exc:
        raise ModelError(
            f"The hub at {endpoint} has no {manifest.repo} at revision {manifest.revision} "
            f"({type(exc).__name__}); check the hub endpoint."
        ) from None
    except errors.EntryNotFoundError:
        raise ModelError(
            f"The hub at {endpoint} lacks a file of {manifest.repo} at revision "
            f"{manifest.revision}; check the hub endpoint."
        ) from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "error"
        raise ModelError(f"The hub at {endpoint} answered HTTP {status}; {retry}.") from None
    except _network_errors() as exc:
        raise ModelError(
            f"Could not download model {manifest.name} from {endpoint} "
            f"({type(exc).__name__}: {_short(exc)}); check the network, then {retry}."
        ) from None


def _network_errors() -> tuple[type[BaseException], ...]:
    """Transport errors of whichever HTTP client this huggingface-hub version uses."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (
        ("httpx2", "HTTPError"),
        ("httpx", "HTTPError"),
        ("requests", "RequestException"),
    ):
        client = sys.modules.get(module)
        if client is not None and isinstance(getattr(client, name, None), type):
            found.append(getattr(client, name))
    return tuple(found)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:160]


def _say(stream: TextIO | None, line: str) -> None:
    if stream is not None:
        stream.write(line + "\n")
        stream.flush()


def progress_class(stream: TextIO | None, *, label: str, tty: bool | None = None) -> Any:
    """A tqdm class for huggingface-hub's ``tqdm_class``: a bar on a terminal, lines otherwise."""
    from tqdm import tqdm

    if stream is None:

        class Silent(tqdm):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["disable"] = True
                super().__init__(*args, **kwargs)

        return Silent
    is_tty = stream.isatty() if tty is None else tty
    if is_tty:

        class Bar(tqdm):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.update(file=stream, desc=label, dynamic_ncols=True)
                super().__init__(*args, **kwargs)

        return Bar

    class Lines(tqdm):  # type: ignore[misc]
        """Plain lines at 0/25/50/75/100%: readable in logs and pipes (no carriage returns)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True  # tqdm draws nothing; this class prints its own lines
            super().__init__(*args, **kwargs)
            self.done = int(kwargs.get("initial") or 0)
            self.size = kwargs.get("total")
            self.shown = -1
            self._report()

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            self._report()
            return None

        def _report(self) -> None:
            if not self.size:
                return
            quarter = max(0, min(4, self.done * 4 // self.size))
            if quarter > self.shown:
                self.shown = quarter
                _say(stream, f"{label} {quarter * 25}% ({_mb(self.done)} of {_mb(self.size)} MB)")

    return Lines


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f}"
