"""The list of kept checkpoints a resumed trial restores from ``tune/`` can name folders that are gone, or the
folder its next checkpoint is written to; CheckpointLedger corrects it before Tune's own manager deletes by it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.train import Checkpoint, CheckpointConfig
from ray.train._internal.checkpoint_manager import _CheckpointManager
from ray.train._internal.session import _TrainingResult

from study.search.tuner import CheckpointLedger


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
