"""The list of kept checkpoints a resumed trial restores from ``tune/`` can name folders that are gone, or the
folder its next checkpoint is written to; CheckpointLedger corrects it before Tune's own manager deletes by it. A
checkpoint written but never registered when a run ended is removed with the run's results."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.train import Checkpoint, CheckpointConfig
from ray.train._internal.checkpoint_manager import _CheckpointManager
from ray.train._internal.session import _TrainingResult
from ray.tune import Result

from study.search.tuner import CheckpointLedger, remove_unkept_checkpoints


def _result(folder: Path, epoch: int) -> _TrainingResult:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.pt").write_text(f"epoch {epoch}")
    return _TrainingResult(checkpoint=Checkpoint.from_directory(str(folder)), metrics={"epoch": epoch})


def _restored_manager(keep: int, results: list[_TrainingResult]) -> _CheckpointManager:
    manager = _CheckpointManager(CheckpointConfig(num_to_keep=keep))
    for result in results:
        manager.register_checkpoint(result)
    return manager


def _register(manager: _CheckpointManager, new: _TrainingResult, ledger: CheckpointLedger | None) -> None:
    """What Tune's controller does with a trial's new checkpoint: callbacks first, then the trial's manager."""
    if ledger is not None:
        ledger.on_checkpoint(0, [], SimpleNamespace(run_metadata=SimpleNamespace(checkpoint_manager=manager)),
                             new.checkpoint)
    manager.register_checkpoint(new)


@pytest.mark.parametrize("ledger", [None, CheckpointLedger()], ids=["tune alone", "with the ledger"])
def test_a_checkpoint_written_under_the_restored_ones_name_survives(tmp_path: Path, ledger) -> None:
    """keep: 1, restored from checkpoint_000007, whose name the next checkpoint reuses (the saved index lagged)."""
    folder = tmp_path / "checkpoint_000007"
    manager = _restored_manager(1, [_result(folder, 8)])
    _register(manager, _result(folder, 9), ledger)
    if ledger is None:  # what the ledger is for: Tune drops the old entry and deletes the only checkpoint
        assert not folder.exists()
    else:
        assert (folder / "state.pt").read_text() == "epoch 9"
        assert [r.checkpoint.path for r in manager.best_checkpoint_results] == [str(folder)]


@pytest.mark.parametrize("ledger", [None, CheckpointLedger()], ids=["tune alone", "with the ledger"])
def test_a_checkpoint_deleted_after_the_last_state_save_is_forgotten(tmp_path: Path, ledger) -> None:
    """keep: 2, the saved list names checkpoint_000002 and _000003, but the killed trial had deleted _000002."""
    gone, kept = _result(tmp_path / "checkpoint_000002", 3), _result(tmp_path / "checkpoint_000003", 4)
    manager = _restored_manager(2, [gone, kept])
    (tmp_path / "checkpoint_000002" / "state.pt").unlink()
    (tmp_path / "checkpoint_000002").rmdir()
    new = _result(tmp_path / "checkpoint_000004", 5)
    if ledger is None:
        with pytest.raises(FileNotFoundError):
            _register(manager, new, ledger)
        return
    _register(manager, new, ledger)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000003", "checkpoint_000004"]
    assert [Path(r.checkpoint.path).name for r in manager.best_checkpoint_results] == ["checkpoint_000003",
                                                                                       "checkpoint_000004"]


def _ended_trial(folder: Path, manager: _CheckpointManager) -> Result:
    """The trial's entry in ``tuner.fit()``'s result grid, built as Tune builds it from the trial's manager."""
    (folder / "result.json").write_text("{}")
    kept = [(result.checkpoint, result.metrics) for result in manager.best_checkpoint_results]
    return Result(metrics={}, checkpoint=kept[-1][0] if kept else None, error=None, path=str(folder),
                  best_checkpoints=kept)


def test_a_checkpoint_written_but_never_registered_is_removed_when_the_run_ends(tmp_path: Path) -> None:
    """keep: 2. The budget stopped the first trial after its worker wrote checkpoint_000004, which the driver never
    registered; the second stopped before its first checkpoint was registered. A data-parallel trial keeps its
    checkpoints inside its Train run's folder, which is not Tune's to prune."""
    first = tmp_path / "trial_a"
    manager = _restored_manager(2, [_result(first / f"checkpoint_00000{i}", i) for i in (1, 2, 3)])
    _result(first / "checkpoint_000004", 4)
    second = tmp_path / "trial_b"
    _result(second / "checkpoint_000000", 1)
    parallel = tmp_path / "trial_c"
    _result(parallel / "run" / "checkpoint_2026-01-01_00-00-00.000000", 1)
    results = [_ended_trial(first, manager), _ended_trial(second, _restored_manager(2, [])),
               _ended_trial(parallel, _restored_manager(2, []))]

    assert remove_unkept_checkpoints(results) == 2
    assert sorted(p.name for p in first.iterdir()) == ["checkpoint_000002", "checkpoint_000003", "result.json"]
    assert (first / "checkpoint_000003" / "state.pt").read_text() == "epoch 3"
    assert sorted(p.name for p in second.iterdir()) == ["result.json"]
    assert (parallel / "run" / "checkpoint_2026-01-01_00-00-00.000000" / "state.pt").is_file()
    assert remove_unkept_checkpoints(results) == 0
