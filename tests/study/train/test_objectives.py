"""Training objectives: prefix expansion, each loss on real batches, and objective/model compatibility."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import models
from study.train.batches import history_new_target_windows, history_prefix_windows, history_windows
from study.train.config import TrainConfig, split_settings
from study.train.objectives import (
    objective_loss,
    resolve_auto_settings,
    resolve_objective,
    resolve_windows,
    scored_positions,
)
from study.train.settings import SCORED_ONCE
from study.train.step import TrainStep
from study.train.trainer import TrialData, epoch_windows


def naive_prefixes(histories: list[list[int]], max_len: int) -> list[tuple[int, ...]]:
    """One window per training item after the first: the up to max_len items before it, then the item."""
    windows = []
    for history in histories:
        for end in range(1, len(history)):
            kept = history[max(0, end - max_len):end + 1]
            windows.append((0,) * (max_len + 1 - len(kept)) + tuple(kept))
    return windows


def as_flat(histories: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(h) for h in histories])
    return np.concatenate([np.array(h) for h in histories]), np.cumsum(lengths) - lengths, lengths


def test_every_prefix_of_the_whole_history_is_one_window():
    histories = [[3, 4, 5, 6, 7, 8, 9], [11], [12, 13], [1, 2, 3, 4]]
    items, starts, lengths = as_flat(histories)
    batches = list(history_prefix_windows(items, starts, lengths, 3, 0, 4, np.random.default_rng(0)))
    assert [len(b.windows) for b in batches] == [4, 4, 2]  # 6 + 0 + 1 + 3 targets
    windows = stacked(batches)
    assert sorted(map(tuple, windows)) == sorted(naive_prefixes(histories, 3))
    # a window never reaches into the previous user's items
    assert (0, 0, 12, 13) in set(map(tuple, windows)) and (0, 0, 1, 2) in set(map(tuple, windows))


def stacked(batches) -> np.ndarray:
    return np.concatenate([batch.windows for batch in batches])


def bert4rec_code_windows(histories: list[list[int]], max_len: int, step: int) -> list[tuple[int, ...]]:
    """BERT4Rec's reference layout, written as it reads: a history longer than max_len is cut into the windows
    starting at len - max_len, len - max_len - step, ... (> 0), and at 0; each as a (max_len + 1)-wide row whose
    first column is the item before the window (or padding)."""
    windows = []
    for history in histories:
        if len(history) < 2:
            continue
        begins = list(range(len(history) - max_len, 0, -step)) + [0] if len(history) > max_len else [0]
        for begin in begins:
            kept = history[max(0, begin - 1):begin + max_len]
            windows.append((0,) * (max_len + 1 - len(kept)) + tuple(kept))
    return windows


@pytest.mark.parametrize(("max_len", "step"), [(3, 1), (4, 2), (5, 3), (5, 5), (4, 4)])
def test_history_windows_are_bert4rec_codes_sliding_windows(max_len, step):
    rng = np.random.default_rng(max_len * 10 + step)
    histories = [list(rng.integers(1, 50, size=n)) for n in (1, 2, 4, 5, 6, 9, 13, 30)]
    items, starts, lengths = as_flat(histories)
    windows = stacked(history_windows(items, starts, lengths, max_len, step, 7, rng))
    assert sorted(map(tuple, windows.tolist())) == sorted(bert4rec_code_windows(histories, max_len, step))


def test_history_windows_cover_every_training_item_once_or_more_on_lastfm(lastfm_prepared):
    data = TrialData.from_prepared(lastfm_prepared, max_len=50)
    split = data.valid
    config = TrainConfig(window_step=5, window_targets="all")
    batches = list(epoch_windows(data, iter(()), "cloze", config, np.random.default_rng(0)))
    windows, users = stacked(batches), np.concatenate([batch.users for batch in batches])
    overhang = np.maximum(split.history_lengths - 50, 0)
    assert len(windows) == int((1 + np.ceil(overhang / 5)).sum())
    # LastFM's long histories: the newest windows alone hold about half of the training items, these hold all
    per_user = np.bincount(users, weights=(windows[:, 1:] > 0).sum(1), minlength=len(overhang))
    assert (per_user >= split.history_lengths).all()
    covered = {(int(u), int(i)) for u, row in zip(users, windows[:, 1:]) for i in row[row > 0]}
    everything = {(u, int(i)) for u, (start, length) in enumerate(zip(split.history_starts, split.history_lengths))
                  for i in split.history_items[start:start + length]}
    assert covered == everything
    newest_only = int(np.minimum(split.history_lengths, 50).sum())
    assert newest_only < 0.6 * split.history_lengths.sum()


def test_window_settings_resolve_per_objective_and_refuse_what_they_cannot_mean():
    assert resolve_windows("causal", None, None, 50, "sasrec") == (10, "new")  # max_len / 5, new targets
    assert resolve_windows("bce", None, None, 50, "sasrec") == (10, "new")
    # a family not validated on whole-history windows (LinRec's causal form) keeps each user's newest window
    assert resolve_windows("causal", None, None, 50, "linrec") == (0, "all")
    assert resolve_windows("causal", 10, None, 50, "linrec") == (10, "new")  # unless a step is asked for
    for validated_too in ("gru4rec", "hstu", "fpmc", "lisa"):
        assert resolve_windows("causal", None, None, 50, validated_too) == (10, "new")
    assert resolve_windows("bce", None, None, 50, "lisa") == (10, "new")
    assert resolve_windows("cloze", None, None, 50, "bert4rec") == (5, "all")  # BERT4Rec's 0.1 x max_len
    assert resolve_windows("causal", 0, "new", 50, "sasrec") == (0, "all")  # one window: nothing is older
    assert resolve_windows("sampled_ce", 7, "all", 50, "sasrec") == (7, "all")
    assert resolve_windows("bce", 10, "tail", 50, "lisa") == (10, "tail")  # a study names it; never a default
    assert resolve_windows("causal", 10, "aligned", 50, "sasrec") == (10, "aligned")
    assert resolve_windows("last", None, None, 50, "sasrec") == (0, "all")
    for args, key in [(("last", 5, None), "window_step"), (("last", None, "new"), "window_targets"),
                      (("cloze", None, "new"), "window_targets"), (("cloze", 5, "tail"), "window_targets"),
                      (("cloze", 5, "aligned"), "window_targets"),
                      (("causal", 51, None), "window_step")]:
        with pytest.raises(models.ConfigError) as error:
            resolve_windows(*args, 50, "sasrec")
        assert error.value.errors[0][0] == key
    step = TrainStep(models.build("sasrec", num_items=10, max_len=5), TrainConfig())
    assert (step.train.window_step, step.train.window_targets) == (1, "new")


def resolved_schedule(model: str, **settings) -> tuple[float, int, int]:
    """``(lr, lr_warmup_steps, lr_decay_patience)`` of a trial of ``model`` at its defaults over ``settings``."""
    train, hparams = split_settings(model, settings)
    users = {"num_users": 5} if models.model_class(model).needs_users else {}
    objective = resolve_objective(models.build(model, num_items=30, **users, **hparams), train.objective)
    ran = resolve_auto_settings(train, objective, hparams.get("max_len", 50), model)
    return ran.lr, ran.lr_warmup_steps, ran.lr_decay_patience


def test_a_familys_schedule_applies_only_where_it_was_validated_and_each_key_set_wins():
    assert resolved_schedule("sasrec") == (6e-3, 110, 3)  # the causal CE on whole-history windows
    for elsewhere in ({"window_step": 0}, {"objective": "last"}, {"objective": "bce"}, {"objective": "sampled_ce"}):
        assert resolved_schedule("sasrec", **elsewhere) == (1e-3, 0, 0), elsewhere
    for validated_too in ("gru4rec", "fpmc"):
        assert resolved_schedule(validated_too) == (6e-3, 110, 3), validated_too
        assert resolved_schedule(validated_too, window_step=0) == (1e-3, 0, 0), validated_too
    assert resolved_schedule("fpmc", objective="bce") == (1e-3, 0, 0)
    for constant in ("lisa", "hstu"):  # validated at the constant rate
        assert resolved_schedule(constant) == (1e-3, 0, 0), constant
    assert resolved_schedule("sasrec", lr=2e-3) == (2e-3, 110, 3)  # the keys not set stay the family's
    assert resolved_schedule("sasrec", window_step=0, lr_warmup_steps=5) == (1e-3, 5, 0)
    assert resolved_schedule("sasrec", lr="auto", lr_decay_patience="auto") == (6e-3, 110, 3)
    # training that stops before a decay could come runs without one; a decay set so is refused (it never runs)
    assert resolved_schedule("sasrec", patience=3) == (6e-3, 110, 0)
    assert resolved_schedule("sasrec", patience=0) == (6e-3, 110, 3)  # never stops
    with pytest.raises(models.ConfigError, match="lr_decay_patience: 3 never decays"):
        resolved_schedule("sasrec", patience=3, lr_decay_patience=3)
    step = TrainStep(models.build("sasrec", num_items=10, max_len=5), TrainConfig())
    assert step.optimizer.param_groups[0]["lr"] == 6e-3 and step.train.lr_warmup_steps == 110  # what a step takes


def test_settings_a_step_resolved_resolve_to_themselves_for_every_model_and_objective():
    """A step built from another step's settings (the sweep's cost estimate does this) runs as the first one does:
    `last` once refused the (0, "all") it resolves to, so every study trained with `last` failed before its
    first trial."""
    checked = []
    for name in models.available():
        users = {"num_users": 5} if models.model_class(name).needs_users else {}
        model = models.build(name, num_items=30, max_len=10, **users)
        for objective in (*model.objectives, *(["sampled_ce"] if "causal" in model.objectives else [])):
            step = TrainStep(model, TrainConfig(objective=objective))
            assert TrainStep(model, step.train).train == step.train, (name, objective)
            checked.append((name, objective))
    assert {("elastic", "last"), ("bert4rec", "cloze"), ("sasrec", "sampled_ce"), ("sasrec", "causal")} <= set(checked)


def test_the_cost_of_a_last_epoch_is_estimated(synthetic_lastfm_prepared):
    """The estimate every sweep prints before its first trial, for a `last` trial: the call that failed."""
    from study.train.cost import epoch_cost

    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=10)
    step = TrainStep(models.build("elastic", num_items=data.num_items, max_len=10),
                     TrainConfig(objective="last", prefixes_per_user=2, batch_size=64))
    cost = epoch_cost(step, data, step.train, torch.device("cpu"))
    assert cost.windows == 2 * len(data.test.inputs) and cost.step_s > 0  # two prefixes of every user


@pytest.mark.parametrize("targets", SCORED_ONCE)
def test_new_target_windows_score_every_training_item_once_with_context(targets):
    sizes = (1, 2, 4, 5, 6, 7, 9, 13, 30, 61)
    ids = np.arange(1, sum(sizes) + 1)  # distinct item ids: each one is one (user, position) of a history
    histories = [list(part) for part in np.split(ids, np.cumsum(sizes)[:-1])]
    position = {int(item): index for history in histories for index, item in enumerate(history)}
    items, starts, lengths = as_flat(histories)
    for max_len, step in [(5, 1), (5, 2), (5, 5), (4, 3), (6, 4)]:
        scored_items, windows = [], 0
        for batch in history_new_target_windows(items, starts, lengths, max_len, step, 4, np.random.default_rng(0),
                                                targets=targets):
            windows += len(batch.windows)
            mask = scored_positions(torch.as_tensor(batch.windows), torch.as_tensor(batch.scored)).numpy()
            context = np.cumsum(batch.windows[:, :-1] > 0, axis=1)  # real input items up to each position
            for row, column in zip(*np.nonzero(mask)):
                target = int(batch.windows[row, column + 1])
                scored_items.append(target)
                # every item before it in the history, up to an older window's guaranteed context, or under `new`
                # up to its column in the newest window (as in the newest-window protocol); `tail` has no exception
                newest = batch.scored[row] == max_len and targets == "new"
                reach = column + 1 if newest else max_len - step + 1
                assert context[row, column] >= min(position[target], reach), (max_len, step, target)
                if targets in ("aligned", "shifting", "single"):  # in the newest `step` slots, as `last`'s are
                    assert column >= max_len - step, (max_len, step, target)
            # no padding inside a history: after the first real item, only `single`'s after its one target
            real = batch.windows > 0
            started = np.cumsum(real, axis=1)[:, :-1].astype(bool)
            if targets == "single":
                assert (mask.sum(1) == 1).all()
                started &= np.arange(max_len)[None, :] < max_len - batch.scored[:, None] + 1
            assert (real[:, 1:] | ~started).all()
        # every training item but each user's first, exactly once an epoch
        assert sorted(scored_items) == sorted(int(i) for history in histories for i in history[1:]), (max_len, step)
        # `new` and `tail` cut a history into the same number of windows, so they cost the same; `aligned` goes on
        # down to the first target
        trained = [size for size in sizes if size >= 2]
        aligned = sum(-(-(size - 1) // step) for size in trained)
        if targets == "aligned":
            assert windows == aligned
        elif targets == "shifting":  # a shifted newest window can leave one more at the oldest end
            assert aligned <= windows <= aligned + len(trained)
        elif targets == "single":  # `last`'s windows: one a target
            assert windows == sum(size - 1 for size in trained)
        else:
            assert windows == sum(1 + -(-max(size - 1 - max_len, 0) // step) for size in trained)


def test_tail_windows_score_a_newest_window_target_with_an_older_windows_context():
    history = list(range(1, 31))  # 30 items: the newest window of 10 (+1) reaches back to item 20
    items, starts, lengths = as_flat([history])
    # `new` scores item 22 in the newest window, after items 20 and 21; `tail` in the window ending at item 25 (5
    # apart), after items 15 ... 21, at least max_len - step + 1 = 6 of them; `last` would give it 12 ... 21
    for targets, context_of_item_22 in [("new", 2), ("tail", 7), ("aligned", 7)]:
        found = []
        for batch in history_new_target_windows(items, starts, lengths, 10, 5, 8, np.random.default_rng(0),
                                                targets=targets):
            mask = scored_positions(torch.as_tensor(batch.windows), torch.as_tensor(batch.scored)).numpy()
            rows, columns = np.nonzero(mask & (batch.windows[:, 1:] == 22))
            found += [int((batch.windows[row, :column + 1] > 0).sum()) for row, column in zip(rows, columns)]
        assert found == [context_of_item_22], targets


def scored_windows(histories: list[list[int]], max_len: int, step: int, targets: str,
                   rng: np.random.Generator | None = None) -> list[tuple[int, ...]]:
    """Each scored target's window as the model reads it: its slots up to the target's, so that a tuple shorter
    than max_len + 1 is a target scored before the newest slot."""
    items, starts, lengths = as_flat(histories)
    found = []
    for batch in history_new_target_windows(items, starts, lengths, max_len, step, 4,
                                            rng or np.random.default_rng(0), targets=targets):
        mask = scored_positions(torch.as_tensor(batch.windows), torch.as_tensor(batch.scored)).numpy()
        for row, column in zip(*np.nonzero(mask)):
            found.append(tuple(int(item) for item in batch.windows[row, :column + 2]))
    return found


def test_tail_and_aligned_windows_a_step_apart_are_lasts_prefixes():
    """A causal model's output at a position reads the slots up to it only. With a step of 1, `tail` trains on
    `last`'s (items before, target) pairs, but scores each user's oldest window's targets at the slots where they
    stand; `aligned` trains on `last`'s windows exactly, each target in the newest slot."""
    histories = [list(range(1, 4)), list(range(10, 22)), list(range(30, 47))]
    prefixes = naive_prefixes(histories, 6)

    def items_only(windows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        return sorted(tuple(item for item in window[-7:] if item > 0) for window in windows)

    tail = scored_windows(histories, 6, 1, "tail")
    assert items_only(tail) == items_only(prefixes)
    assert sorted(tail) != sorted(prefixes)  # the oldest windows' slots differ
    assert sorted(scored_windows(histories, 6, 1, "aligned")) == sorted(prefixes)


def test_shifting_windows_move_each_target_through_the_newest_slots_across_epochs():
    """`aligned` scores a target at the same slot every epoch; `shifting` at each of the newest `step` slots over
    the epochs, each epoch still once. With a step of 1 there is one slot, and the windows are `aligned`'s."""
    histories = [list(range(1, 41)), list(range(50, 54))]
    rng = np.random.default_rng(0)
    slots: dict[int, set[int]] = {}
    for _ in range(60):
        epoch = scored_windows(histories, 8, 4, "shifting", rng)
        assert sorted(window[-1] for window in epoch) == sorted(i for history in histories for i in history[1:])
        for window in epoch:  # the slot counted back from the newest: 0 = the newest, as `last` scores
            slots.setdefault(window[-1], set()).add(8 + 1 - len(window))
    assert all(slots[target] == {0, 1, 2, 3} for target in range(2, 38))
    assert [slots[target] for target in (38, 39, 40)] == [{0, 1, 2}, {0, 1}, {0}]  # no window ends past item 40
    aligned = scored_windows(histories, 8, 4, "aligned")
    assert len({8 + 1 - len(window) for window in aligned if window[-1] == 20}) == 1
    assert sorted(scored_windows(histories, 8, 1, "shifting")) == sorted(scored_windows(histories, 8, 1, "aligned"))


def test_single_windows_score_each_target_alone_at_every_newest_slot_across_epochs():
    """`single` gives every target a window of its own, scored at a random one of the newest `step` slots each
    epoch with padding after it, so the target at the end of a history too reaches every slot; at a step of 1 its
    windows are `last`'s prefixes."""
    histories = [list(range(1, 41)), list(range(50, 54))]
    rng = np.random.default_rng(0)
    slots: dict[int, set[int]] = {}
    for _ in range(60):
        epoch = scored_windows(histories, 8, 4, "single", rng)
        assert sorted(window[-1] for window in epoch) == sorted(i for history in histories for i in history[1:])
        for window in epoch:
            slots.setdefault(window[-1], set()).add(8 + 1 - len(window))
            # the up to 8 - slot items before the target, as a prefix of `last` cut by the slots after it
            history = next(h for h in histories if window[-1] in h)
            end = history.index(window[-1])
            kept = history[max(0, end - (len(window) - 1)):end + 1]
            assert window == (0,) * (len(window) - len(kept)) + tuple(kept)
    assert all(slots[target] == {0, 1, 2, 3} for target in (*range(2, 41), 51, 52, 53))
    assert sorted(scored_windows(histories, 8, 1, "single")) == sorted(naive_prefixes(histories, 8))


def test_a_causal_models_output_at_a_target_ignores_the_padded_slots_after_it():
    """What `single` relies on: a causal model scores a target the same whether the slots after it hold the
    history's next items or padding."""
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=60, max_len=8).eval()
    real = torch.tensor([[0, 0, 5, 9, 11, 2, 40, 33]])
    padded = real.clone()
    padded[:, -3:] = 0  # the target after item 11 scored three slots before the newest
    torch.testing.assert_close(model(padded)[:, :5], model(real)[:, :5])


@pytest.mark.parametrize("targets", SCORED_ONCE)
def test_a_new_target_epoch_on_lastfm_scores_each_training_item_once(lastfm_prepared, targets):
    data = TrialData.from_prepared(lastfm_prepared, max_len=50)
    config = TrainConfig(window_step=10, window_targets=targets, batch_size=512)
    counts = np.zeros(len(data.valid.history_lengths), dtype=np.int64)
    windows = 0
    for batch in epoch_windows(data, iter(()), "causal", config, np.random.default_rng(0)):
        mask = scored_positions(torch.as_tensor(batch.windows), torch.as_tensor(batch.scored)).numpy()
        counts += np.bincount(batch.users, weights=mask.sum(1), minlength=len(counts)).astype(np.int64)
        windows += len(batch.windows)
    np.testing.assert_array_equal(counts, np.maximum(data.valid.history_lengths - 1, 0))
    newest = int((data.valid.history_lengths >= 2).sum())
    if targets == "single":  # a window a target
        assert windows == counts.sum()
    else:
        assert newest < windows < 10 * newest  # about one window per 10 items past the newest 50


def test_each_epoch_shuffles_the_windows_differently():
    histories = [list(range(1, 40)), list(range(50, 90))]
    items, starts, lengths = as_flat(histories)
    rng = np.random.default_rng(0)
    first, second = (stacked(history_prefix_windows(items, starts, lengths, 5, 0, 8, rng)) for _ in range(2))
    assert sorted(map(tuple, first)) == sorted(map(tuple, second))
    assert not np.array_equal(first, second)


def test_sampled_prefixes_come_from_each_users_whole_history():
    histories = [list(range(1, 31)), [40, 41, 42]]
    items, starts, lengths = as_flat(histories)
    windows = stacked(history_prefix_windows(items, starts, lengths, 4, 50, 1000, np.random.default_rng(0)))
    assert len(windows) == 100
    allowed = set(naive_prefixes(histories, 4))
    assert set(map(tuple, windows)) <= allowed
    targets = windows[:, -1]
    assert np.count_nonzero(targets >= 40) == 50 and set(targets[targets >= 40]) == {41, 42}
    assert targets[targets < 40].min() < 10  # early targets, outside the last max_len + 1 items, are drawn too


def recbole_sample_count(inter_file: Path, kcore: int) -> int:
    """RecBole's augmentation count from the raw file: per user, (training length - 1), summed.

    Leave-one-out keeps the last two interactions for validation and test, so training length = n - 2.
    """
    frame = pd.read_csv(inter_file, sep="\t", usecols=[0, 1])
    frame.columns = ["user", "item"]
    while True:  # iterative k-core over users and items
        users, items = frame["user"].map(frame["user"].value_counts()), frame["item"].map(frame["item"].value_counts())
        kept = frame[(users >= kcore) & (items >= kcore)]
        if len(kept) == len(frame):
            break
        frame = kept
    per_user = frame.groupby("user").size()
    return int((per_user - 2 - 1).clip(lower=0).sum())


def test_last_epoch_has_recboles_sample_count_on_ml100k(ml100k_prepared, shared_datasets):
    max_len = 50
    data = TrialData.from_prepared(ml100k_prepared, max_len=max_len)
    config = TrainConfig(batch_size=4096, prefixes_per_user=0)
    windows = stacked(epoch_windows(data, iter(()), "last", config, np.random.default_rng(0)))
    assert len(windows) == recbole_sample_count(shared_datasets / "ml-100k" / "ml-100k.inter", kcore=5)
    # the stored windows (max_len + 1 items per user) hold well under half of them
    assert len(expand_stored_windows(data.train)) < 0.5 * len(windows)
    split = data.valid
    histories = [split.history_items[start:start + length].tolist()
                 for start, length in zip(split.history_starts, split.history_lengths)]
    assert sorted(map(tuple, windows.tolist())) == sorted(naive_prefixes(histories, max_len))


def expand_stored_windows(windows: np.ndarray) -> np.ndarray:
    """Targets the old expansion saw: real items with a real item before them inside the stored window."""
    return np.flatnonzero(((windows[:, 1:] > 0) & (windows[:, :-1] > 0)).ravel())


@pytest.mark.parametrize("objective", ["causal", "last", "bce"])
def test_each_objective_decreases_its_loss_on_a_batch(synthetic_lastfm_prepared, objective):
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=50)
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=data.num_items, max_len=50, dropout=0.0, attn_dropout=0.0)
    windows = data.train[:64]
    if objective == "last":
        split = data.valid
        starts, lengths = split.history_starts[:64], split.history_lengths[:64]
        rng = np.random.default_rng(0)
        windows = next(history_prefix_windows(split.history_items, starts, lengths, 50, 1, 64, rng)).windows
    batch = torch.as_tensor(windows, dtype=torch.long)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = objective_loss(objective, model, batch, mask_prob=0.2, generator=generator)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.8 * losses[0]


def test_objective_compatibility_errors_name_the_key_and_reason():
    model = models.build("sasrec", num_items=10, max_len=5)
    assert resolve_objective(model, "auto") == "causal"
    with pytest.raises(models.ConfigError, match="objective: sasrec cannot train with 'cloze': it is a causal-only"):
        resolve_objective(model, "cloze")


@pytest.mark.parametrize("trim", [False, True])
def test_a_causal_loss_over_new_targets_is_the_cross_entropy_at_those_positions_only(trim):
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=30, max_len=6, dropout=0.0, attn_dropout=0.0)
    windows = torch.tensor([[0, 0, 0, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3]])
    scored = torch.tensor([6, 2, 1])
    loss = objective_loss("causal", model, windows, mask_prob=0.2, generator=torch.Generator(), scored=scored,
                          trim=trim)
    logits = model(windows[:, :-1]) @ model.item_weights().T
    logits[..., 0] = float("-inf")
    rows, columns = [0, 0, 0, 1, 1, 2], [3, 4, 5, 4, 5, 5]  # row 0: its real targets; rows 1, 2: the newest ones
    expected = torch.nn.functional.cross_entropy(logits[rows, columns], windows[rows, [c + 1 for c in columns]])
    torch.testing.assert_close(loss, expected)
    everything = objective_loss("causal", model, windows, mask_prob=0.2, generator=torch.Generator(), trim=trim)
    assert not torch.isclose(loss, everything)
    with pytest.raises(ValueError, match="cloze"):
        objective_loss("cloze", model, windows, mask_prob=0.2, generator=torch.Generator(), scored=scored)
