"""`make check-experiments`: every committed miniature still reproduces from its recorded command.

A committed result folder (``experiments/<study>/tiny/``, ``experiments/sweep-examples/<name>/``) that holds a
``command.txt`` (the arguments of ``python -m specnoise`` that made it; ``#`` lines are comments) is re-run into a
temporary directory, and every row's ``new_tokens`` and ``target_forwards`` - exact counts, unlike timings - must
equal the committed ``report.csv``'s. Rows are matched on job, decoder, model, draft, benchmark and category.
Slow (minutes per miniature on a CPU): ``make check-experiments``, or ``-k msn-table1`` for one.

A ``command.txt`` may say how long its re-run takes on the 2-core CPU, in a comment line ``# check-minutes: N``.
A miniature of 20 minutes or more (one that trains models first) is also marked ``long``, so
``make check-experiments-quick`` (``-m "slow and not long"``) leaves it out; its time limit is three times N.
``make check-experiments JOBS=2`` runs two miniatures at once (pytest-xdist), each on its own thread.
A ``# check: skip REASON`` line leaves a folder out (with its reason). Comment lines ``# env: NAME=VALUE`` set
environment variables for the re-run (``OMP_NUM_THREADS=1`` for a miniature that trains: fp32 training on the CPU
reproduces token for token only with the thread count it ran with).

Miniatures that fine-tune the same model (``msn-table3`` and ``msn-figure4/lengths`` train the same two) say
``# train-cache: shared``: they share one ``train.cache_dir`` for the whole check run (training/reuse.py), so such a
model is trained once per check, by whichever miniature gets there first; the other waits on its lock, then reuses
it. Its report rows then name the model after the other miniature's job (``small-code+msn@5``), so rows are compared
on the model's name without its ``@job``.

A study that counts what the runner does not record is a short script over the library instead of a
``python -m specnoise`` command: a ``# script: PATH`` line (relative to the repository) runs ``python PATH ARGS``, and
its printed table must equal the folder's ``# output: FILE`` (default ``result.md``) exactly - such a script prints
exact counts only.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specnoise.report import collect
from specnoise.training.reuse import without_job
from test_experiments import compose_job, needs_shipped, sweep_jobs

REPO = Path(__file__).resolve().parents[1]
COMMANDS = sorted(REPO.glob("experiments/**/command.txt"))
KEYS = ["job", "decoder", "model", "draft", "benchmark", "category"]
COUNTS = ["new_tokens", "target_forwards"]
LONG_MINUTES = 20  # a re-run at least this long is marked `long` (left out of `make check-experiments-quick`)


def check_minutes(path: Path) -> float | None:
    """The re-run time the folder's ``command.txt`` states (``# check-minutes: N``), or None."""
    found = re.search(r"^#\s*check-minutes:\s*([0-9.]+)", path.read_text(), flags=re.MULTILINE)
    return float(found.group(1)) if found else None


def command_env(path: Path) -> dict[str, str]:
    """The ``# env: NAME=VALUE`` lines of a ``command.txt``."""
    return dict(m.groups() for m in re.finditer(r"^#\s*env:\s*(\w+)=(\S*)", path.read_text(), flags=re.MULTILINE))


def param(path: Path):
    minutes = check_minutes(path)
    marks = [pytest.mark.long] if minutes is not None and minutes >= LONG_MINUTES else []
    skip = re.search(r"^#\s*check:\s*skip\b\s*(.*)", path.read_text(), flags=re.MULTILINE)
    if skip:  # a folder its command alone cannot reproduce (e.g. a search that was interrupted on purpose)
        marks.append(pytest.mark.skip(reason=skip.group(1) or "its command.txt says `# check: skip`"))
    return pytest.param(path, marks=marks, id=str(path.parent.relative_to(REPO / "experiments")))


def command_script(path: Path) -> tuple[Path, str] | None:
    """The ``# script: PATH`` a folder re-runs instead of the entry point, with its ``# output: FILE``, or None."""
    text = path.read_text()
    script = re.search(r"^#\s*script:\s*(\S+)", text, flags=re.MULTILINE)
    output = re.search(r"^#\s*output:\s*(\S+)", text, flags=re.MULTILINE)
    return (REPO / script.group(1), output.group(1) if output else "result.md") if script else None


def command_args(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return shlex.split(" ".join(lines))


def counts(df: pd.DataFrame) -> pd.DataFrame:
    df = df[[k for k in KEYS if k in df] + COUNTS].copy()
    for key in KEYS:  # csv round trips turn job 0 into an int and a missing draft into NaN / "none"
        df[key] = df[key].fillna("none").astype(str) if key in df else "none"
    # a trained model's label ends in the job that trained it (base+stage@job): with the check's shared training
    # cache that may be another miniature's job. The row's own job is a key already, so nothing is lost
    df["model"] = df["model"].map(without_job)
    return df.set_index(KEYS).sort_index()


def differences(committed: pd.DataFrame, rerun: pd.DataFrame) -> list[str]:
    old, new = counts(committed), counts(rerun)
    out = [f"only in the committed report: {k}" for k in old.index.difference(new.index)]
    out += [f"only in the re-run: {k}" for k in new.index.difference(old.index)]
    both = old.index.intersection(new.index)
    for key in both:
        a, b = old.loc[key, COUNTS].astype(int).tolist(), new.loc[key, COUNTS].astype(int).tolist()
        if a != b:
            out.append(f"{key}: committed new_tokens, target_forwards = {a}, re-run = {b}")
    return out


def test_check_minutes_marks_long_reruns(tmp_path):
    quick, long, none = (tmp_path / n for n in ("quick.txt", "long.txt", "none.txt"))
    quick.write_text("# python -m specnoise ...\n# check-minutes: 3\n# env: OMP_NUM_THREADS=1\n"
                     "+experiment=x logger=none\n")
    long.write_text("# check-minutes: 95\n+experiment=y\n")
    none.write_text("+experiment=z\n")
    assert [check_minutes(p) for p in (quick, long, none)] == [3.0, 95.0, None]
    assert command_args(quick) == ["+experiment=x", "logger=none"]
    assert command_env(quick) == {"OMP_NUM_THREADS": "1"} and command_env(long) == {}
    assert command_script(quick) is None
    assert not shares_training(quick)
    long.write_text("# check-minutes: 95\n# train-cache: shared\n+experiment=y\n")
    assert shares_training(long) and command_args(long) == ["+experiment=y"]
    script = tmp_path / "script.txt"
    script.write_text("# script: experiments/x/count.py\n# check-minutes: 2\nbenchmark.limit=3\n")
    assert command_script(script) == (REPO / "experiments/x/count.py", "result.md")
    assert command_args(script) == ["benchmark.limit=3"]
    scripts = [(p, command_script(p)) for p in COMMANDS if command_script(p)]
    assert all(s.is_file() and (p.parent / out).is_file() for p, (s, out) in scripts)  # what the slow check re-runs
    long_ones = [p for p in COMMANDS if any(m.name == "long" for m in param(p).marks)]
    assert all(check_minutes(p) >= LONG_MINUTES for p in long_ones)


def test_differences_name_each_changed_row():
    """The comparison itself, on two small tables (no model): what the slow check relies on."""
    committed = pd.DataFrame({"job": [0, 0, 1], "decoder": ["ar", "jacobi", "ar"], "model": "m", "draft": [None] * 3,
                              "benchmark": "humaneval", "category": "all", "new_tokens": [10, 10, 7],
                              "target_forwards": [10, 8, 7]})
    assert differences(committed, committed.assign(draft="none", job=["0", "0", "1"])) == []
    trained = committed.assign(model="small-code+msn@0")  # the same model, trained by another miniature's job 5
    assert differences(trained, trained.assign(model="small-code+msn@5")) == []
    rerun = committed.assign(target_forwards=[10, 9, 7]).iloc[:2]
    found = differences(committed, rerun)
    assert len(found) == 2 and "only in the committed report" in found[0] and "[10, 8], re-run = [10, 9]" in found[1]


@pytest.fixture(scope="session")
def shared_train_cache(tmp_path_factory, pytestconfig) -> Path:
    """One ``train.cache_dir`` for every miniature of this check run, across pytest-xdist workers too (each worker's
    base folder lies in the run's common one); ``--train-cache DIR``: that folder, an earlier run's models in it."""
    given = pytestconfig.getoption("--train-cache")
    if given:
        return Path(given).expanduser().resolve()
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "trained-models"


def shares_training(path: Path) -> bool:
    """Whether the folder's ``command.txt`` has a ``# train-cache: shared`` line: its jobs train with the check run's
    shared ``train.cache_dir``. Opt-in, as the cache's key does not hold the thread count that training ran with."""
    return re.search(r"^#\s*train-cache:\s*shared\b", path.read_text(), flags=re.MULTILINE) is not None


def test_committed_html_reports_quote_their_command():
    """A committed report.html shows its folder's command.txt (``report_html.write_html`` reads it when the report
    is built), so an edit of command.txt afterwards (a new check-minutes line) must reach the page too."""
    from specnoise.report_html import esc

    pages = [p.parent / "report.html" for p in COMMANDS if (p.parent / "report.html").is_file()]
    assert pages, "no committed report.html: the test has nothing to check"
    stale = [str(page.relative_to(REPO)) for page in pages
             if f"<h2>Command</h2><pre>{esc((page.parent / 'command.txt').read_text().strip())}</pre>"
             not in page.read_text()]
    assert not stale, f"report.html older than its command.txt (rebuild the report, or its Command section): {stale}"


@needs_shipped
def test_miniatures_that_share_training_train_the_same_models():
    """The shared cache is sound only if the sharing miniatures' training jobs are the same trainings (same training
    keys) on the same thread count, so each one is trained once, by whichever gets there first; and every job of
    theirs, those that train nothing too, accepts the check's ``train.cache_dir`` override."""
    from specnoise.config import refuse_ignored_overrides
    from specnoise.training.reuse import training_key

    shared = [p for p in COMMANDS if shares_training(p)]
    assert len(shared) >= 2, "a shared training cache needs two miniatures"
    keys, threads = [], {command_env(p).get("OMP_NUM_THREADS") for p in shared}
    for path in shared:
        (preset,) = [a.split("=", 1)[1] for a in command_args(path) if a.startswith("+experiment=")]
        jobs = [compose_job(preset, job) for job in sweep_jobs(preset)]
        for conf in jobs:
            refuse_ignored_overrides(conf, ["train.cache_dir=/check/trained-models"])
        keys.append({training_key(conf)[0] for conf in jobs if conf.train.name != "none"})
    assert len(threads) == 1 and keys[0] and all(k == keys[0] for k in keys), (shared, keys, threads)


@pytest.mark.slow
@pytest.mark.parametrize("command", [param(p) for p in COMMANDS])
def test_committed_miniature_reproduces(command: Path, tmp_path: Path, shared_train_cache: Path):
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
               **command_env(command))
    timeout = max(3600, 3 * 60 * (check_minutes(command) or 0))
    script = command_script(command)
    if script:  # a study that prints exact counts: its table, re-printed, must equal the committed one
        path, output = script
        proc = subprocess.run([sys.executable, str(path), *command_args(command)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        committed = (command.parent / output).read_text().strip()
        assert proc.stdout.strip() == committed, f"{command.parent} does not reproduce:\n{proc.stdout}\nvs\n{committed}"
        return
    args = command_args(command) + [f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.run.dir={tmp_path / 'run'}"]
    if shares_training(command):
        args.append(f"train.cache_dir={shared_train_cache}")
    proc = subprocess.run([sys.executable, "-m", "specnoise", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rerun, jobs = collect([tmp_path / "sweep" if (tmp_path / "sweep").is_dir() else tmp_path / "run"])
    found = [f"job {j.path} failed: {j.error}" for j in jobs if j.error]
    found += differences(pd.read_csv(command.parent / "report.csv"), rerun)
    assert not found, f"{command.parent} does not reproduce ({len(found)} rows):\n" + "\n".join(found[:20])
