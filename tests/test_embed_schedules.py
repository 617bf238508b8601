"""Learning-rate schedules and early stopping through the CLI: reduce on plateau gives the
rates PyTorch's own ReduceLROnPlateau gives for the run's validation MRRs, early stopping ends
a run (and a resume keeps it stopped), and options that cannot apply exit 2 naming them."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import needs

SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "--threads", "1"]


def meta(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def test_reduce_on_plateau_gives_pytorchs_rates(kg, tmp_path, strata_cli):
    torch = needs("torch")
    run = tmp_path / "r"
    plateau = ["--lr-scheduler", "reduce_on_plateau", "--lr-factor", "0.5", "--lr-patience", "0"]
    plateau += ["--lr-threshold", "0.05", "--lr-cooldown", "1", "--lr-min", "0.02"]
    proc = strata_cli("embed", "train", kg, "--run-dir", run, *SMALL, "--epochs", "7", "--lr", "0.1", *plateau)
    hist = meta(run)["history"]
    rates = [h["lr"] for h in hist]
    assert rates[0] == 0.1
    # PyTorch's scheduler, stepped with the same validation MRRs, sets the rate of each next epoch.
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=rates[0])
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode="max", factor=0.5, patience=0, threshold=0.05, threshold_mode="rel", cooldown=1, min_lr=0.02
    )
    expected = []
    for h in hist:
        expected.append(opt.param_groups[0]["lr"])
        sched.step(h["valid"]["mrr"])
    assert rates == expected, [(h["lr"], h["valid"]["mrr"]) for h in hist]
    assert min(rates) < rates[0], "the rate never dropped: the test would check nothing"
    assert meta(run)["schedule"]["lr"] == opt.param_groups[0]["lr"]
    # The epoch lines give the rate and the drops.
    assert "lr 0.1" in proc.stderr and "validation MRR on a plateau: lr 0.1 -> 0.05" in proc.stderr, proc.stderr


def test_early_stopping_ends_the_run_and_a_resume_keeps_it_stopped(kg, tmp_path, strata_cli):
    run = tmp_path / "r"
    # A best MRR no run of this graph reaches: after more than 1 epoch the next validation stops.
    stop = ["--early-stopping-threshold-epochs", "1", "--early-stopping-threshold-mrr", "0.99"]
    proc = strata_cli("embed", "train", kg, "--run-dir", run, *SMALL, "--epochs", "5", *stop)
    m = meta(run)
    assert m["current"]["epoch"] == 2 and len(m["history"]) == 2
    assert "below early_stopping_threshold_mrr 0.99 after 2 epochs" in m["schedule"]["stopped"]
    assert m["history"][1]["stopped"] == m["schedule"]["stopped"]
    assert "stopping early: best validation MRR" in proc.stderr, proc.stderr
    assert "stopped early after epoch 2" in proc.stdout, proc.stdout
    assert m["test"] is not None
    again = strata_cli("embed", "train", kg, "--run-dir", run, *SMALL, "--epochs", "5", *stop)
    assert meta(run)["current"]["epoch"] == 2
    assert "stopped early after epoch 2" in again.stdout
    # Early stopping by patience: at most patience validations after the best one.
    patient = tmp_path / "p"
    strata_cli("embed", "train", kg, "--run-dir", patient, *SMALL, "--epochs", "6", "--lr", "2.0",
               "--early-stopping-patience", "1")  # fmt: skip
    hist = meta(patient)["history"]
    if meta(patient)["schedule"].get("stopped"):
        assert hist[-2]["best"] and not hist[-1]["best"], hist
    else:
        assert len(hist) == 6


def test_options_that_cannot_apply_exit_2_naming_them(kg, tmp_path, strata_cli):
    def refused(*args) -> str:
        proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, *args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "r" / "run.json").exists()
        return proc.stderr

    assert "lr_scheduler" in refused("--lr-scheduler", "reduce_on_plateau", "--eval-every", "0")
    assert "eval_every" in refused("--early-stopping-patience", "3", "--eval-every", "0")
    assert "lr_factor" in refused("--lr-scheduler", "reduce_on_plateau", "--lr-factor", "1.5")
    assert "--lr-threshold-mode" in refused("--lr-threshold-mode", "relative")
