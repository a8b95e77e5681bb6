import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one thread is as fast and immune to oversubscription on a shared machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _pg_bin() -> str | None:
    import glob
    import shutil

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    initdb = found[-1] if found else shutil.which("initdb")
    return None if initdb is None else initdb.rsplit("/", 1)[0]


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A PostgreSQL server of this test session: its own data folder, listening only on a local socket; the URL of its
    database. Skipped (with the reason) where the server is not installed (scripts/install-test-postgres.sh, run by
    ``make test``, installs Debian's postgresql)."""
    import os
    import shutil
    import subprocess

    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (make test installs Debian's postgresql through "
                    "scripts/install-test-postgres.sh when it runs as root with apt-get)")
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="attnkit-pg-"))  # outside pytest's 0700 folder: the server's user reads it
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    run_as = []
    if os.geteuid() == 0:  # the server refuses to run as root: as the postgres user Debian's package creates
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as its own user")
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    port = "5439"
    subprocess.run([*run_as, f"{bindir}/initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
                   check=True, capture_output=True)
    subprocess.run([*run_as, f"{bindir}/pg_ctl", "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                    f"-k {sock} -c listen_addresses='' -p {port} -c fsync=off", "start"], check=True,
                   capture_output=True)
    try:
        yield f"postgresql://postgres@/postgres?host={sock}&port={port}"
    finally:
        subprocess.run([*run_as, f"{bindir}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
