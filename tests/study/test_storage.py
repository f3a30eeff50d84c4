"""Cloud storage of a study's results: URIs in study files, the mirror, and a real sweep mirrored to S3.

The S3 store is a real S3-compatible server (moto) on 127.0.0.1 (``s3_server`` in conftest); pyarrow talks to it
exactly as to AWS, through ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest

from study.errors import UserError
from study.storage import Mirror, check_uri, local_copy, main, resolve_storage

REPO = Path(__file__).resolve().parents[2]


def test_a_folder_is_used_as_it_is_and_a_uri_gets_a_local_working_copy(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_storage(None, "s") == (tmp_path / "results" / "s", None)
    assert resolve_storage(str(tmp_path / "x"), "s") == (tmp_path / "x", None)
    assert resolve_storage("s3://bucket/studies/s/", "s") == (tmp_path / "results" / "s", "s3://bucket/studies/s")
    assert resolve_storage("gs://b/p", "s")[1] == "gs://b/p"
    assert resolve_storage("file:///mnt/share/s", "s")[1] == "file:///mnt/share/s"


@pytest.mark.parametrize(("raw", "message"), [
    ("ftp://host/x", "expected a folder or a URI with one of the schemes s3, gs"),
    ("http://host/x", "expected a folder or a URI with one of the schemes"),
    ("s3://", "name a bucket and a prefix"),
    ("s3:/bucket/x", "looks like a URI with one slash; write s3://bucket/x"),
    (5, "expected a folder or a URI, got 5"),
])
def test_bad_storage_is_refused_with_advice(raw: object, message: str) -> None:
    with pytest.raises(UserError, match=message):
        resolve_storage(raw, "s")


def test_a_uri_in_a_study_file_resolves_and_a_bad_one_is_a_config_error(tmp_path: Path) -> None:
    study = tmp_path / "s3.yaml"
    body = "name: s3\nmodel: sasrec\ndataset: {name: synthetic}\nsearch: {lr: {loguniform: [1.0e-3, 1.0e-2]}}\n"
    study.write_text(body + "storage: s3://bucket/results/s3\n")
    done = subprocess.run([sys.executable, "-m", "study.sweep", str(study), "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert "storage: s3://bucket/results/s3" in done.stdout
    study.write_text(body + "storage: ftp://host/results\n")
    done = subprocess.run([sys.executable, "-m", "study.sweep", str(study), "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 2
    assert "storage: ftp://host/results: expected a folder or a URI with one of the schemes" in done.stderr


def s3_files(bucket: str, prefix: str) -> dict[str, bytes]:
    fs, root = pafs.FileSystem.from_uri(f"{bucket}/{prefix}")
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {info.path[len(root) + 1:]: fs.open_input_stream(info.path).read()
            for info in infos if info.type == pafs.FileType.File}


def make_folder(root: Path) -> None:
    (root / "trials").mkdir(parents=True)
    (root / "trials" / "a.json").write_text('{"trial_id": "a"}\n')
    (root / "study.yaml").write_text("name: s\n")
    (root / ".trials.parquet.x1.tmp").write_text("half a file")  # an atomic writer's scratch file
    with sqlite3.connect(root / "optuna.db") as db:
        db.execute("create table trials (number integer)")
        db.executemany("insert into trials values (?)", [(0,), (1,), (2,)])


def test_push_is_incremental_and_skips_scratch_files(tmp_path: Path, s3_bucket: str) -> None:
    local = tmp_path / "study"
    make_folder(local)
    mirror = Mirror(local, f"{s3_bucket}/studies/s", interval_s=3600)
    assert mirror.push() == 3
    assert sorted(s3_files(s3_bucket, "studies/s")) == ["optuna.db", "study.yaml", "trials/a.json"]
    (local / "trials" / "b.json").write_text('{"trial_id": "b"}\n')
    assert mirror.push() == 0  # throttled: the last push was less than interval_s ago
    assert mirror.push(force=True) == 1  # only the new file
    (local / "study.yaml").write_text("name: s\nmodel: sasrec\n")
    assert mirror.push(force=True) == 1
    assert s3_files(s3_bucket, "studies/s")["study.yaml"] == b"name: s\nmodel: sasrec\n"
    assert mirror.push(force=True) == 0


def test_first_push_is_sent_on_a_machine_that_just_booted(tmp_path: Path, s3_bucket: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """time.monotonic() counts from boot: a machine up for seconds must not see its first push as throttled."""
    local = tmp_path / "study"
    make_folder(local)
    clock = iter([2.0, 2.5, 3.0, 3.5])
    monkeypatch.setattr("study.storage.time.monotonic", lambda: next(clock))
    mirror = Mirror(local, f"{s3_bucket}/studies/s", interval_s=3600)
    assert mirror.push() == 3  # first push, whatever the clock says
    (local / "trials" / "b.json").write_text('{"trial_id": "b"}\n')
    assert mirror.push() == 0  # the throttle still holds after it


def _time_namespace_works() -> bool:
    probe = subprocess.run(["unshare", "--time", "--monotonic=-1", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
def test_storage_suite_passes_with_the_monotonic_clock_near_zero(tmp_path: Path) -> None:
    """The whole storage module in a time namespace whose monotonic clock reads a few seconds, as CI on a machine
    that booted a minute ago (this test is skipped where unprivileged time namespaces are not allowed)."""
    if shutil.which("unshare") is None or not _time_namespace_works():
        pytest.skip("unshare --time is not permitted here")
    uptime = int(float(Path("/proc/uptime").read_text().split()[0]))
    done = subprocess.run(
        ["unshare", "--time", f"--monotonic=-{max(uptime - 5, 0)}", sys.executable, "-m", "pytest", "-q",
         "-p", "no:cacheprovider", "-n", "0", str(Path(__file__)), "-k", "not monotonic_clock_near_zero and not sweep"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_the_sqlite_database_arrives_whole_while_a_connection_holds_it(tmp_path: Path, s3_bucket: str) -> None:
    local = tmp_path / "study"
    make_folder(local)
    holder = sqlite3.connect(local / "optuna.db")
    holder.execute("insert into trials values (3)")  # an open transaction, not committed
    Mirror(local, f"{s3_bucket}/s").push(force=True)
    holder.rollback()
    holder.close()
    copy = tmp_path / "copy.db"
    copy.write_bytes(s3_files(s3_bucket, "s")["optuna.db"])
    with sqlite3.connect(copy) as db:
        assert [row[0] for row in db.execute("select number from trials order by number")] == [0, 1, 2]


def test_pull_fills_a_fresh_folder_and_keeps_local_files_unless_told(tmp_path: Path, s3_bucket: str) -> None:
    source = tmp_path / "study"
    make_folder(source)
    uri = f"{s3_bucket}/s"
    Mirror(source, uri).push(force=True)

    fresh = tmp_path / "fresh"
    assert Mirror(fresh, uri).pull() == 3
    for name in ("study.yaml", "trials/a.json"):
        assert (fresh / name).read_bytes() == (source / name).read_bytes()
    with sqlite3.connect(fresh / "optuna.db") as db:  # a snapshot: the same rows, not the same pages
        assert [row[0] for row in db.execute("select number from trials order by number")] == [0, 1, 2]
    assert not (fresh / ".trials.parquet.x1.tmp").exists()

    (fresh / "study.yaml").write_text("a local edit, newer than the upload\n")
    assert Mirror(fresh, uri).pull() == 0
    assert (fresh / "study.yaml").read_text() == "a local edit, newer than the upload\n"
    assert Mirror(fresh, uri).pull(overwrite=True) == 1
    assert (fresh / "study.yaml").read_text() == "name: s\n"


def test_the_command_line_copies_both_ways_and_local_copy_fetches_a_uri(tmp_path: Path, s3_bucket: str,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture) -> None:
    source = tmp_path / "study"
    make_folder(source)
    assert main(["push", str(source), f"{s3_bucket}/copies/s"]) == 0
    assert "3 file(s)" in capsys.readouterr().out
    assert main(["pull", f"{s3_bucket}/copies/s", str(tmp_path / "back")]) == 0
    assert (tmp_path / "back" / "trials" / "a.json").is_file()
    assert main(["pull", f"{s3_bucket}/nothing/here", str(tmp_path / "none")]) == 2
    assert f"error: nothing under {s3_bucket}/nothing/here" in capsys.readouterr().err

    monkeypatch.chdir(tmp_path)
    assert local_copy(f"{s3_bucket}/copies/s") == Path("results/s").resolve()
    assert (tmp_path / "results" / "s" / "study.yaml").read_text() == "name: s\n"
    assert local_copy(tmp_path / "study") == tmp_path / "study"


def test_an_unreachable_store_is_a_clear_error(tmp_path: Path, s3_server: dict[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    make_folder(tmp_path / "study")
    with pytest.raises(UserError, match="cannot (upload|open|list)"):
        Mirror(tmp_path / "study", "s3://no-such-bucket/s").push(force=True)
    assert check_uri("s3://bucket/x/") == "s3://bucket/x"


# ---------------------------------------------------------------------------------------------------------------
# A real sweep mirrored to S3


@pytest.mark.slow
def test_a_sweep_mirrors_to_s3_and_resumes_from_it_on_a_machine_without_the_copy(
        tmp_path: Path, s3_bucket: str, write_tiny_sweep, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """The commands' own main() on one Ray started here (the AWS variables of ``s3_server`` are in this process, so
    its workers have them): a sweep, its refused restart, its resume and a replicate batch each in a fresh process
    would start Ray four times."""
    import ray

    from study import replicate, sweep
    from study.cluster import start_ray

    monkeypatch.chdir(tmp_path)  # a URI's working copy goes to ./results/<name>
    monkeypatch.setenv("SEQREC_DATA", str(tmp_path / "cache"))
    uri = f"{s3_bucket}/studies/mirrored"
    study = write_tiny_sweep(tmp_path / "study.yaml", name="mirrored", storage=uri, samples=2, max_concurrent=1)

    def run(command: object, *args: str) -> tuple[int, str, str]:
        code = command.main([*args, "--quiet"])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    start_ray("local", num_cpus=2, quiet=True)
    try:
        code, stdout, stderr = run(sweep, str(study))
        assert code == 0, stderr[-3000:]
        assert f"mirrored to {uri}" in stdout

        local = tmp_path / "results" / "mirrored"
        remote = s3_files(s3_bucket, "studies/mirrored")
        for name in ("study.yaml", "environment.json", "trials.parquet", "trials.csv", "history.parquet"):
            assert remote[name] == (local / name).read_bytes(), name
        (tmp_path / "optuna.db").write_bytes(remote["optuna.db"])
        with sqlite3.connect(tmp_path / "optuna.db") as db:
            assert db.execute("select count(*) from trials").fetchone()[0] == 2
        records = sorted(name for name in remote if name.startswith("trials/"))
        assert len(records) == 2 and records == sorted(f"trials/{p.name}" for p in (local / "trials").glob("*.json"))
        assert any(name.startswith("tune/experiment_state") for name in remote)

        shutil.rmtree(local)  # the driver's machine is gone; the bucket is all there is
        code, _, stderr = run(sweep, str(study))
        assert code == 2
        assert f"{uri} already holds study 'mirrored'; pass --resume" in stderr
        assert not local.exists()

        code, stdout, stderr = run(sweep, str(study), "--resume")
        assert code == 0, stderr[-3000:]
        assert "fetched" in stdout and f"from {uri}" in stdout
        trials = pd.read_parquet(local / "trials.parquet")
        assert len(trials) == 2 and (trials["status"] == "ok").all()
        assert set(trials["trial_id"]) == {Path(name).stem for name in records}

        # replicates of a study read from its URI: fetched into results/<last part>/, and the batch goes back up
        shutil.rmtree(local)
        code, stdout, stderr = run(replicate, uri, "--seeds", "1", "--select", "top:1")
        assert code == 0, stderr[-3000:]
    finally:
        ray.shutdown()
    assert f"{uri}: " in stdout and "fetched into results/mirrored" in stdout
    replicates = pd.read_parquet(local / "replicates.parquet")
    assert len(replicates) == 1 and (replicates["status"] == "ok").all()
    remote = s3_files(s3_bucket, "studies/mirrored")
    assert remote["replicates.parquet"] == (local / "replicates.parquet").read_bytes()
    assert any(name.startswith("replicates/001/trials/") for name in remote)


def test_a_mounted_share_by_file_uri_is_mirrored_like_a_bucket(tmp_path: Path) -> None:
    local, share = tmp_path / "study", tmp_path / "share" / "studies" / "s"
    make_folder(local)
    mirror = Mirror(local, f"file://{share}")
    assert mirror.push(force=True) == 3  # the share's folders are created as needed
    assert (share / "trials" / "a.json").read_text() == '{"trial_id": "a"}\n'
    assert sorted(mirror.remote_files()) == ["optuna.db", "study.yaml", "trials/a.json"]
    assert Mirror(tmp_path / "back", f"file://{share}").pull() == 3
    assert (tmp_path / "back" / "study.yaml").read_text() == "name: s\n"
