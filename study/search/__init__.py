"""A sweep on Ray Tune: the trial function, data-parallel trials, the Optuna searcher, the recorder, the runner."""
