"""Teams held up by other processes (``cgru/_kernels/parallel.h``): a team whose helper starts
late — it shared its core with a busy process — makes the next teams smaller for a while, so
that a loaded machine does not make a 2-thread call wait a scheduler time slice at every
region; the results stay bitwise those of any other team size.  The backoff is opt-in
(``CGRU_TEAMS_BACKOFF=1``); these tests turn it on."""
import os
import subprocess
import sys

import numpy as np
import pytest

import cgru
from cgru._kernels import threads

pytestmark = pytest.mark.skipif(
    not threads.parallel_enabled() or threads.parallel_info()["cores"] < 2,
    reason="needs OpenMP teams and 2 usable cores")


@pytest.fixture
def backoff():
    old = threads._set_backoff(teams_always=False, reset=True)
    yield
    threads._set_backoff(teams_always=old, reset=True)


def _problem():
    # one time loop with a team (batch 1, H = 256) and a column-split input projection
    net = cgru.Network.random(cgru.Topology(64, 256), np.float32, seed=1)
    x = np.random.default_rng(2).standard_normal((40, 1, 64)).astype(np.float32)
    return net, x


def _teams():
    return threads._counters()["teams"]


def test_a_held_up_team_makes_the_next_teams_smaller(backoff):
    net, x = _problem()
    want = cgru.forward(net, x, num_threads=1)
    before, held = _teams(), threads._backoff()["held_ups"]
    threads._set_backoff(held_up=True)                 # as if its helper had started late
    first = cgru.forward(net, x, num_threads=2)
    assert _teams() > before                           # that call still ran its teams
    assert threads._backoff()["held_ups"] == held + 1
    assert threads._backoff()["backing_off"]
    before = _teams()
    second = cgru.forward(net, x, num_threads=2)
    assert _teams() == before, "a team ran while backing off (2 cores: teams of one)"
    threads._set_backoff(reset=True)
    third = cgru.forward(net, x, num_threads=2)
    assert _teams() > before, "no team after the backoff ended"
    for got in (first, second, third):
        np.testing.assert_array_equal(got.y, want.y)
        np.testing.assert_array_equal(got.hy, want.hy)


def test_the_backoff_is_opt_in(backoff):
    net, x = _problem()
    threads._set_backoff(teams_always=True)
    threads._set_backoff(held_up=True)
    cgru.forward(net, x, num_threads=2)
    before = _teams()
    cgru.forward(net, x, num_threads=2)
    assert _teams() > before
    code = ("from cgru._kernels import threads; "
            "print(threads._backoff()['teams_always'])")
    for value, want in (("1", "False"), ("0", "True"), (None, "True")):
        env = {k: v for k, v in os.environ.items() if k != "CGRU_TEAMS_BACKOFF"}
        if value is not None:
            env["CGRU_TEAMS_BACKOFF"] = value
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want, (value, out.stdout, out.stderr)


def test_busy_processes_on_every_core_are_noticed(backoff):
    """With a busy process on every usable core, a 2-thread batch-1 call's helpers start late
    (they wait for a core): within a bounded number of calls a team is found held up, and the
    results stay those of one thread.  Counts events; nothing is timed."""
    net, x = _problem()
    want = cgru.forward(net, x, num_threads=1)
    cores = threads.parallel_info()["cores"]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(cores)]
    try:
        held = threads._backoff()["held_ups"]
        for _ in range(400):
            got = cgru.forward(net, x, num_threads=2)
            np.testing.assert_array_equal(got.y, want.y)
            if threads._backoff()["held_ups"] > held:
                break
        assert threads._backoff()["held_ups"] > held, "no held-up team in 400 calls"
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait(timeout=30)
