"""End-to-end tests of `kerasdist-run --max-restarts` and `--min-np`."""

import json
import sys

from test_supervise import RUNNER, SCRIPTS, run_bounded

# Rank 1 fails on the first attempt only (marker file in $DIR); every rank
# prints its attempt.
FAIL_ONCE = ('echo "rank $PMI_RANK restart=${KERASDIST_RESTART:-none}"; '
             'if [ "$PMI_RANK" = 1 ] && [ ! -e "$DIR/failed" ]; then '
             'touch "$DIR/failed"; exit 4; fi')


def test_restart_after_a_failure(tmp_path):
    out = run_bounded([*RUNNER, "-np", 2, "--max-restarts", 2,
                       "sh", "-c", FAIL_ONCE], 60, env={"DIR": str(tmp_path)})
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert ("kerasdist-run: rank 1 (host " in out.stderr and
            ") exited with code 4; restarting the job (restart 1 of 2)."
            in out.stderr), out.stderr
    lines = sorted(out.stdout.splitlines())
    assert "[1] rank 1 restart=none" in lines  # The first attempt.
    assert "[0] rank 0 restart=1" in lines and "[1] rank 1 restart=1" in lines
    # (Rank 0's first line may be lost: the job stops as rank 1 fails.)


def test_no_restarts_left(tmp_path):
    out = run_bounded([*RUNNER, "-np", 2, "--max-restarts", 1,
                       "sh", "-c", 'if [ "$PMI_RANK" = 0 ]; then exit 5; fi'],
                      60)
    assert out.returncode == 5, (out.stdout, out.stderr)
    assert "restarting the job (restart 1 of 1)." in out.stderr
    assert out.stderr.rstrip().endswith(
        "exited with code 5; the job failed (no restarts left).")


def test_min_np_leaves_out_a_host_that_keeps_failing():
    # localhost and 127.0.0.1 are two hosts to Hydra. The rank on 127.0.0.1
    # fails while the job has 2 ranks: after two failures in a row the host
    # is left out and the job runs on 1 rank.
    script = ('if [ "$PMI_HOSTNAME" = 127.0.0.1 ]; then exit 6; fi; '
              'echo "ok size=$PMI_SIZE restart=$KERASDIST_RESTART"')
    out = run_bounded([*RUNNER, "-np", 2, "-H",
                       "localhost:1,127.0.0.1:1", "--max-restarts", 3,
                       "--min-np", 1, "sh", "-c", script], 60)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert ("kerasdist-run: leaving out host 127.0.0.1 (it failed twice in a "
            "row): 1 ranks on localhost:1") in out.stderr
    assert out.stderr.count("exited with code 6; restarting the job") == 2
    assert "[0] ok size=1 restart=2" in out.stdout.splitlines()


def test_fit_resumes_after_a_rank_kills_itself(tmp_path):
    # 3 epochs at np=2; rank 1 SIGKILLs itself in epoch 2 on the first
    # attempt. BackupAndRestore resumes the second attempt at epoch 2.
    out = run_bounded([*RUNNER, "-np", 2, "--max-restarts", 1,
                       sys.executable, SCRIPTS / "restart_fit.py", tmp_path], 150,
                      env={"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert ("was killed by signal 9 (SIGKILL); restarting the job (restart 1 "
            "of 1).") in out.stderr
    assert (tmp_path / "crashed").exists()
    epochs = [json.loads(line) for line in
              (tmp_path / "epochs.log").read_text().splitlines()]
    assert epochs == [{"epoch": 0, "attempt": 0}, {"epoch": 1, "attempt": 1},
                      {"epoch": 2, "attempt": 1}]
    history = json.loads((tmp_path / "history.json").read_text())
    assert history == {"epoch": [1, 2], "attempt": 1}
    digests = [(tmp_path / f"weights.{r}").read_text() for r in (0, 1)]
    assert len(digests[0]) == 64 and digests[0] == digests[1]
