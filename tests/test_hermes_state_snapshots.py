"""A store's snapshots live under the home ``doctor`` reports for it; ``backup --list`` and
``--keep N`` see only that store's; no home is created with a looser mode than 0700."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from conftest import subprocess_env
from hermes_state import SessionDB

REPO_ROOT = Path(__file__).resolve().parent.parent


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # HOME points at an empty folder: nothing may appear in it for a store given by --db.
    env = subprocess_env({"HOME": str(home), "HERMES_HOME": None})
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def make_store(path: Path) -> Path:
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "hello")
    return path


def test_backup_of_a_db_file_goes_under_the_home_doctor_reports(tmp_path: Path) -> None:
    user_home = tmp_path / "user"
    user_home.mkdir()
    db = make_store(tmp_path / "data" / "work.db")
    done = cli(user_home, "--db", str(db), "backup", "--json")
    assert done.returncode == 0, done.stderr
    snapshot = Path(json.loads(done.stdout)["snapshot"])
    doctor = cli(user_home, "--db", str(db), "doctor", "--json")
    home = json.loads(doctor.stdout)["home"]
    assert snapshot.parent == db.parent / "state-snapshots"
    assert Path(home).expanduser() == db.parent
    assert snapshot.name.startswith("work-") and list(user_home.iterdir()) == []


def test_list_and_keep_see_only_this_stores_snapshots(tmp_path: Path) -> None:
    user_home = tmp_path / "user"
    user_home.mkdir()
    ours, theirs = make_store(tmp_path / "a.db"), make_store(tmp_path / "b.db")
    taken = [json.loads(cli(user_home, "--db", str(ours), "backup", "--json").stdout)["snapshot"]
             for _ in range(3)]
    other = json.loads(cli(user_home, "--db", str(theirs), "backup", "--json").stdout)
    listed = json.loads(cli(user_home, "--db", str(ours), "backup", "--list", "--json").stdout)
    assert [s["path"] for s in listed["snapshots"]] == list(reversed(taken))  # newest first
    kept = cli(user_home, "--db", str(ours), "backup", "--keep", "2", "--json")
    assert kept.returncode == 0, kept.stderr
    newest = json.loads(kept.stdout)["snapshot"]
    assert sorted(json.loads(kept.stdout)["deleted"]) == sorted(taken[:2])
    left = json.loads(cli(user_home, "--db", str(ours), "backup", "--list", "--json").stdout)
    assert [s["path"] for s in left["snapshots"]] == [newest, taken[2]]
    assert Path(other["snapshot"]).exists()  # another store's snapshot is never touched
    text = cli(user_home, "--db", str(ours), "backup", "--list")
    assert text.returncode == 0 and newest in text.stdout and other["snapshot"] not in text.stdout
    assert cli(user_home, "--db", str(ours), "backup", "--keep", "-1").returncode == 2


def test_a_new_home_and_its_parents_are_created_private(tmp_path: Path) -> None:
    home = tmp_path / "new" / "deeper" / "home"
    SessionDB(home / "state.db").close()
    for folder in (tmp_path / "new", tmp_path / "new" / "deeper", home):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, folder
